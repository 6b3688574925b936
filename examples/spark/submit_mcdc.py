"""Run the mcdc CLI under spark-submit, in the session spark-submit configured (master, archives, conf):
``spark-submit [spark options] submit_mcdc.py sync --engine spark --source ... --target ...``"""

from pyspark.sql import SparkSession

from replicator.cli import main

SparkSession.builder.getOrCreate()  # made first, so mcdc uses it instead of starting one on --spark-master
main()
