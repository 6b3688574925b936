"""mcdc: a MongoDB change-data-capture replicator.

The flow, one module (or package) per stage::

    source/  ->  normalize  ->  filters  ->  sinks/  ->  checkpoint
                         pipeline owns the loop
"""

__version__ = "0.1.0"
