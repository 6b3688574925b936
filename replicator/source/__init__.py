"""Reading the source: connections, the catalog, snapshot partitions and change streams."""
