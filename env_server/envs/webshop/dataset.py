"""WebShop's public data, as `limen-data fetch webshop` downloads and checks it (see envs/datasets.py)."""

from __future__ import annotations

from env_server.envs.datasets import Asset, Dataset

_AGENTGYM_DATA = (
    "https://raw.githubusercontent.com/WooooDyy/AgentGym/3ef9235d23e68e7c2920c5422ad957dc8ced5c6c"
    "/agentenv-webshop/webshop/data"
)
_BASELINE_DATA = (
    "https://raw.githubusercontent.com/princeton-nlp/WebShop/64fa2a5c15c7daa698b9ac93f5bb5437b634c9bd"
    "/baseline_models/data"
)

DATASET = Dataset(
    name="webshop",
    env_var="WEBSHOP_DATA",  # catalog.DATA_ENV (not imported: declaring the data must stay cheap)
    # setup.sh -d small fetches the two catalog files from Google Drive, where a file can change under
    # the same id. The same files are vendored unchanged in AgentGym; a commit-pinned copy has a fixed
    # sha256, so that is where we fetch them. Provenance: docs/DATA.md#webshop.
    assets=(
        Asset(
            "items_shuffle_1000.json",
            f"{_AGENTGYM_DATA}/items_shuffle_1000.json",
            "30a4765c3a327af72d9a9a95a6b2486d516f0fa1d3ecd83681901ce82a21b269",
        ),
        Asset(
            "items_ins_v2_1000.json",
            f"{_AGENTGYM_DATA}/items_ins_v2_1000.json",
            "f88a36314a397b53b3d9c3fa5878e5f7b26d35019a51ec83fbedeca61a948f6f",
        ),
        Asset(
            "human_goals.json",
            f"{_BASELINE_DATA}/human_goals.json",
            "b68746ed66cd31fdc5f70eb3f5831a46b38163563b57a66ddcab8fd60ee0cbdc",
        ),
        Asset(
            "goal_query_map.json",
            f"{_BASELINE_DATA}/goal_query_map.json",
            "1524f438ffbc51c7e308e635d7d9e14fa696b08f5d4300922d454ef0105cea86",
        ),
        # Human goals for the small world: only on Google Drive (setup.sh), hash unknown to us.
        Asset(
            "items_human_ins.json",
            "https://drive.usercontent.google.com/download"
            "?id=14Kb5SPBk_jfdLZ_CDBNitW98QLDlKR5O&export=download&confirm=t",
            None,
        ),
    ),
)
