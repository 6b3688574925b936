"""mcdc's MongoDB source as a Lakeflow community connector (sources/mcdc/ of lakeflow-community-connectors)."""

from databricks.labs.community_connector.sources.mcdc.mcdc import McdcLakeflowConnect
from databricks.labs.community_connector.sparkpds import LakeflowSource


class McdcDataSource(LakeflowSource):
    _lakeflow_connect_cls = McdcLakeflowConnect


__all__ = ["McdcDataSource", "McdcLakeflowConnect"]
