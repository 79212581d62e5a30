import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_committed_stubs_match_the_proto(tmp_path):
    """Fails when proto/towerps.proto changed without regenerating the stubs
    (run `python scripts/generate_protos.py` and commit the result)."""
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "generate_protos.py"), "--out", str(tmp_path)],
        check=True, capture_output=True,
    )
    for name in ("towerps_pb2.py", "towerps_pb2.pyi", "towerps_pb2_grpc.py"):
        fresh = (tmp_path / name).read_text()
        committed = (ROOT / "proto" / name).read_text()
        assert fresh == committed, f"proto/{name} is stale: run python scripts/generate_protos.py"


def test_stubs_import_as_a_subpackage_not_as_top_level_proto():
    grpc_stub = (ROOT / "proto" / "towerps_pb2_grpc.py").read_text()
    assert "from towerps.proto import towerps_pb2" in grpc_stub
    assert "\nimport towerps_pb2" not in grpc_stub
