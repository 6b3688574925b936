"""Lakehouse targets: Delta Lake (``--target delta:PATH``) and Apache Iceberg (``--target iceberg:PATH``).

``tables`` (layout, columns, rows) and ``fold`` (events to a state table's changes) are pure; ``sink`` is the
Sink; ``delta`` and ``iceberg`` are the two formats' I/O (the ``lake`` extra: deltalake, pyiceberg), and
``formats`` opens the one a target names.
"""
