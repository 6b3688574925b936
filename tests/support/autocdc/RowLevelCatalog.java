package mcdc.testcatalog;

import java.io.*;
import java.nio.file.*;
import java.util.*;
import java.util.concurrent.ConcurrentHashMap;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.analysis.NoSuchNamespaceException;
import org.apache.spark.sql.catalyst.analysis.NoSuchTableException;
import org.apache.spark.sql.catalyst.analysis.TableAlreadyExistsException;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.connector.catalog.*;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.*;
import org.apache.spark.sql.connector.write.*;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * A minimal DSv2 catalog for tests whose tables support MERGE/UPDATE/DELETE through
 * copy-on-write row-level operations (SupportsRowLevelOperations): every row-level operation scans
 * the whole table (one group) and its commit replaces the whole table with the rows written.
 *
 * Data lives in driver memory (a static map shared by every instance of the catalog in the JVM)
 * and, when the catalog option "path" is set, also in one file per table under that directory, so
 * that a later JVM (another spark-pipelines run, or a plain session) sees the same tables.
 *
 * Config: spark.sql.catalog.NAME=mcdc.testcatalog.RowLevelCatalog
 *         spark.sql.catalog.NAME.path=/some/dir   (optional)
 *         spark.sql.catalog.NAME.namespaces=strict (optional, with path: a namespace exists only once
 *           created, as in Iceberg's and Delta's catalogs; by default every namespace exists)
 * Not for production: no concurrency control beyond one lock, whole-table rewrites.
 */
public class RowLevelCatalog implements TableCatalog, SupportsNamespaces {
  private static final Map<String, TableData> MEMORY = new ConcurrentHashMap<>();
  private static final Object LOCK = new Object();

  private String name;
  private String path;  // null: memory only
  private boolean strict;  // namespaces exist only once created (a file NS.namespace under path)

  /** One table's state: schema, properties and rows (UnsafeRow copies). Serializable to a file. */
  static final class TableData implements Serializable {
    private static final long serialVersionUID = 1L;
    String schemaJson;
    Map<String, String> props;
    List<byte[]> rows = new ArrayList<>();
    transient StructType schema;

    StructType schema() {
      if (schema == null) schema = (StructType) DataType.fromJson(schemaJson);
      return schema;
    }

    List<InternalRow> internalRows() {
      int n = schema().size();
      List<InternalRow> out = new ArrayList<>(rows.size());
      for (byte[] b : rows) {
        UnsafeRow r = new UnsafeRow(n);
        r.pointTo(b, b.length);
        out.add(r);
      }
      return out;
    }
  }

  @Override public void initialize(String name, CaseInsensitiveStringMap options) {
    this.name = name;
    this.path = options.get("path");
    this.strict = path != null && "strict".equals(options.get("namespaces"));
    if (path != null) new File(path).mkdirs();
  }

  @Override public String name() { return name; }

  private String key(Identifier ident) {
    return name + "/" + String.join(".", ident.namespace()) + "." + ident.name();
  }

  private File file(Identifier ident) {
    return new File(path, String.join(".", ident.namespace()) + "." + ident.name() + ".tbl");
  }

  TableData read(Identifier ident) {
    synchronized (LOCK) {
      if (path == null) return MEMORY.get(key(ident));
      File f = file(ident);
      if (!f.exists()) return null;
      try (ObjectInputStream in = new ObjectInputStream(new FileInputStream(f))) {
        return (TableData) in.readObject();
      } catch (IOException | ClassNotFoundException e) {
        throw new RuntimeException(e);
      }
    }
  }

  void write(Identifier ident, TableData data) {
    synchronized (LOCK) {
      if (path == null) { MEMORY.put(key(ident), data); return; }
      File f = file(ident);
      File tmp = new File(f.getPath() + ".tmp");
      try (ObjectOutputStream out = new ObjectOutputStream(new FileOutputStream(tmp))) {
        out.writeObject(data);
      } catch (IOException e) {
        throw new RuntimeException(e);
      }
      try {
        Files.move(tmp.toPath(), f.toPath(), StandardCopyOption.REPLACE_EXISTING,
            StandardCopyOption.ATOMIC_MOVE);
      } catch (IOException e) {
        throw new RuntimeException(e);
      }
    }
  }

  boolean delete(Identifier ident) {
    synchronized (LOCK) {
      if (path == null) return MEMORY.remove(key(ident)) != null;
      return file(ident).delete();
    }
  }

  /** Converts rows of `schema` to UnsafeRow bytes. */
  static List<byte[]> toBytes(StructType schema, Iterable<InternalRow> rows) {
    UnsafeProjection proj = UnsafeProjection.create(schema);
    List<byte[]> out = new ArrayList<>();
    for (InternalRow r : rows) out.add(proj.apply(r).copy().getBytes());
    return out;
  }

  // ---- TableCatalog ----

  @Override public Identifier[] listTables(String[] namespace) {
    List<Identifier> out = new ArrayList<>();
    String ns = String.join(".", namespace);
    if (path == null) {
      String prefix = name + "/" + ns + ".";
      for (String k : MEMORY.keySet()) {
        if (k.startsWith(prefix)) out.add(Identifier.of(namespace, k.substring(prefix.length())));
      }
    } else {
      File[] files = new File(path).listFiles();
      if (files != null) for (File f : files) {
        String n = f.getName();
        if (n.endsWith(".tbl") && n.startsWith(ns + ".")) {
          out.add(Identifier.of(namespace, n.substring(ns.length() + 1, n.length() - 4)));
        }
      }
    }
    return out.toArray(new Identifier[0]);
  }

  @Override public Table loadTable(Identifier ident) throws NoSuchTableException {
    if (read(ident) == null) throw new NoSuchTableException(ident);
    return new RowLevelTable(this, ident);
  }

  @Override public Table createTable(Identifier ident, TableInfo info)
      throws TableAlreadyExistsException, NoSuchNamespaceException {
    if (!namespaceExists(ident.namespace())) throw new NoSuchNamespaceException(ident.namespace());
    synchronized (LOCK) {
      if (read(ident) != null) throw new TableAlreadyExistsException(ident);
      TableData d = new TableData();
      d.schemaJson = CatalogV2Util.v2ColumnsToStructType(info.columns()).json();
      d.props = new HashMap<>(info.properties());
      d.props.put(TableCatalog.PROP_PROVIDER, "mcdc-rowlevel");
      write(ident, d);
    }
    return new RowLevelTable(this, ident);
  }

  @Override public Table createTable(Identifier ident, Column[] columns, Transform[] partitions,
      Map<String, String> properties) throws TableAlreadyExistsException, NoSuchNamespaceException {
    return createTable(ident, new TableInfo.Builder().withColumns(columns)
        .withPartitions(partitions).withProperties(properties).build());
  }

  @Override public Table alterTable(Identifier ident, TableChange... changes)
      throws NoSuchTableException {
    synchronized (LOCK) {
      TableData d = read(ident);
      if (d == null) throw new NoSuchTableException(ident);
      scala.collection.immutable.Seq<TableChange> seq =
          scala.jdk.javaapi.CollectionConverters.asScala(Arrays.asList(changes)).toSeq();
      StructType oldSchema = d.schema();
      StructType newSchema = CatalogV2Util.applySchemaChanges(
          oldSchema, seq, scala.Option.empty(), "ALTER TABLE");
      Map<String, String> newProps = CatalogV2Util.applyPropertiesChanges(d.props, seq);
      // Re-lay the rows out for the new schema: columns matched by name, new ones null.
      List<InternalRow> moved = new ArrayList<>();
      StructField[] nf = newSchema.fields();
      for (InternalRow r : d.internalRows()) {
        Object[] vals = new Object[nf.length];
        for (int i = 0; i < nf.length; i++) {
          if (oldSchema.getFieldIndex(nf[i].name()).isDefined()) {
            int j = oldSchema.fieldIndex(nf[i].name());
            vals[i] = r.isNullAt(j) ? null : r.get(j, oldSchema.fields()[j].dataType());
          }
        }
        moved.add(new GenericInternalRow(vals));
      }
      TableData nd = new TableData();
      nd.schemaJson = newSchema.json();
      nd.props = new HashMap<>(newProps);
      nd.rows = toBytes(newSchema, moved);
      write(ident, nd);
    }
    return new RowLevelTable(this, ident);
  }

  @Override public boolean dropTable(Identifier ident) { return delete(ident); }

  @Override public void renameTable(Identifier from, Identifier to)
      throws NoSuchTableException, TableAlreadyExistsException {
    synchronized (LOCK) {
      TableData d = read(from);
      if (d == null) throw new NoSuchTableException(from);
      if (read(to) != null) throw new TableAlreadyExistsException(to);
      write(to, d);
      delete(from);
    }
  }

  // ---- SupportsNamespaces: every namespace exists, unless namespaces=strict ----

  private File namespaceFile(String[] ns) { return new File(path, String.join(".", ns) + ".namespace"); }

  // as Iceberg's catalogs (option default-namespace): Spark's default is none, which a pipeline cannot use
  @Override public String[] defaultNamespace() { return new String[] {"default"}; }
  @Override public String[][] listNamespaces() { return new String[][] {{"default"}}; }
  @Override public String[][] listNamespaces(String[] ns) { return new String[0][]; }
  @Override public Map<String, String> loadNamespaceMetadata(String[] ns)
      throws NoSuchNamespaceException {
    if (!namespaceExists(ns)) throw new NoSuchNamespaceException(ns);
    return new HashMap<>();
  }
  @Override public boolean namespaceExists(String[] ns) { return !strict || namespaceFile(ns).exists(); }
  @Override public void createNamespace(String[] ns, Map<String, String> md) {
    if (!strict) return;
    try {
      namespaceFile(ns).createNewFile();
    } catch (IOException e) {
      throw new RuntimeException(e);
    }
  }
  @Override public void alterNamespace(String[] ns, NamespaceChange... changes) {}
  @Override public boolean dropNamespace(String[] ns, boolean cascade) { return false; }

  // ---- the table ----

  static final class RowLevelTable
      implements SupportsRead, SupportsWrite, SupportsRowLevelOperations, TruncatableTable {
    private final RowLevelCatalog catalog;
    private final Identifier ident;
    private final TableData snapshot;

    RowLevelTable(RowLevelCatalog catalog, Identifier ident) {
      this.catalog = catalog;
      this.ident = ident;
      this.snapshot = catalog.read(ident);
    }

    @Override public String name() { return catalog.name + "." + ident; }
    @Override public StructType schema() { return snapshot.schema(); }
    @Override public Column[] columns() {
      return CatalogV2Util.structTypeToV2Columns(snapshot.schema(), false);
    }
    @Override public Map<String, String> properties() { return snapshot.props; }
    @Override public Set<TableCapability> capabilities() {
      return EnumSet.of(TableCapability.BATCH_READ, TableCapability.BATCH_WRITE,
          TableCapability.TRUNCATE);
    }

    @Override public boolean truncateTable() {
      replaceAll(Collections.emptyList());
      return true;
    }

    /** Replaces every row of the table (keeps its current schema and properties). */
    void replaceAll(List<byte[]> rows) {
      synchronized (LOCK) {
        TableData cur = catalog.read(ident);
        TableData nd = new TableData();
        nd.schemaJson = cur.schemaJson;
        nd.props = cur.props;
        nd.rows = rows;
        catalog.write(ident, nd);
      }
    }

    void appendRows(List<byte[]> rows) {
      synchronized (LOCK) {
        TableData cur = catalog.read(ident);
        cur.rows.addAll(rows);
        catalog.write(ident, cur);
      }
    }

    @Override public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
      // Reads the current table contents (not the snapshot taken at load time).
      return () -> new FullScan(catalog.read(ident));
    }

    @Override public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
      return new TruncatingWriteBuilder(this, info.schema(), false);
    }

    @Override public RowLevelOperationBuilder newRowLevelOperationBuilder(
        RowLevelOperationInfo info) {
      RowLevelOperation.Command command = info.command();
      RowLevelTable table = this;
      return () -> new RowLevelOperation() {
        @Override public RowLevelOperation.Command command() { return command; }
        @Override public String description() { return "copy-on-write " + command; }
        @Override public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
          return table.newScanBuilder(options);
        }
        @Override public WriteBuilder newWriteBuilder(LogicalWriteInfo winfo) {
          // The scan read the whole table: the rows written are the whole new table.
          return new TruncatingWriteBuilder(table, winfo.schema(), true);
        }
      };
    }
  }

  // ---- reads ----

  static final class FullScan implements Scan, Batch {
    private final TableData data;
    FullScan(TableData data) { this.data = data; }
    @Override public StructType readSchema() { return data.schema(); }
    @Override public Batch toBatch() { return this; }
    @Override public InputPartition[] planInputPartitions() {
      return new InputPartition[] {new RowsPartition(data.rows, data.schema().size())};
    }
    @Override public PartitionReaderFactory createReaderFactory() { return new RowsReaderFactory(); }
  }

  static final class RowsPartition implements InputPartition {
    final List<byte[]> rows;
    final int numFields;
    RowsPartition(List<byte[]> rows, int numFields) {
      this.rows = new ArrayList<>(rows);
      this.numFields = numFields;
    }
  }

  static final class RowsReaderFactory implements PartitionReaderFactory {
    @Override public PartitionReader<InternalRow> createReader(InputPartition p) {
      RowsPartition part = (RowsPartition) p;
      Iterator<byte[]> it = part.rows.iterator();
      return new PartitionReader<InternalRow>() {
        private UnsafeRow current;
        @Override public boolean next() {
          if (!it.hasNext()) return false;
          byte[] b = it.next();
          current = new UnsafeRow(part.numFields);
          current.pointTo(b, b.length);
          return true;
        }
        @Override public InternalRow get() { return current; }
        @Override public void close() {}
      };
    }
  }

  // ---- writes ----

  static final class TruncatingWriteBuilder implements WriteBuilder, SupportsTruncate {
    private final RowLevelTable table;
    private final StructType schema;
    private boolean replace;
    TruncatingWriteBuilder(RowLevelTable table, StructType schema, boolean replace) {
      this.table = table;
      this.schema = schema;
      this.replace = replace;
    }
    @Override public WriteBuilder truncate() { replace = true; return this; }
    @Override public Write build() {
      boolean rep = replace;
      return new Write() {
        @Override public BatchWrite toBatch() {
          return new BatchWrite() {
            @Override public DataWriterFactory createBatchWriterFactory(PhysicalWriteInfo info) {
              return new RowsWriterFactory(schema);
            }
            @Override public void commit(WriterCommitMessage[] messages) {
              List<byte[]> rows = new ArrayList<>();
              for (WriterCommitMessage m : messages) rows.addAll(((RowsMessage) m).rows);
              if (rep) table.replaceAll(rows); else table.appendRows(rows);
            }
            @Override public void abort(WriterCommitMessage[] messages) {}
          };
        }
      };
    }
  }

  static final class RowsMessage implements WriterCommitMessage {
    final List<byte[]> rows;
    RowsMessage(List<byte[]> rows) { this.rows = rows; }
  }

  static final class RowsWriterFactory implements DataWriterFactory {
    private final StructType schema;
    RowsWriterFactory(StructType schema) { this.schema = schema; }
    @Override public DataWriter<InternalRow> createWriter(int partitionId, long taskId) {
      UnsafeProjection proj = UnsafeProjection.create(schema);
      List<byte[]> rows = new ArrayList<>();
      return new DataWriter<InternalRow>() {
        @Override public void write(InternalRow row) { rows.add(proj.apply(row).copy().getBytes()); }
        @Override public WriterCommitMessage commit() { return new RowsMessage(rows); }
        @Override public void abort() {}
        @Override public void close() {}
      };
    }
  }
}
