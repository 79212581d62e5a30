"""Generate the Python gRPC stubs for proto/towerps.proto.

    python scripts/generate_protos.py            # write proto/towerps_pb2*.py
    python scripts/generate_protos.py --out DIR  # write them elsewhere (the staleness test)

The .proto is compiled as `towerps/proto/towerps.proto` so that the generated
code imports `towerps.proto.towerps_pb2`, never a top-level `proto` module
(that name belongs to proto-plus, which ray[default] installs).
"""

import argparse
import pathlib
import shutil
import sys
import tempfile

from grpc_tools import protoc

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROTO = ROOT / "proto" / "towerps.proto"
GENERATED = ("towerps_pb2.py", "towerps_pb2.pyi", "towerps_pb2_grpc.py")


def generate(out_dir: pathlib.Path) -> list[pathlib.Path]:
    """Compile PROTO into out_dir; returns the files written."""
    with tempfile.TemporaryDirectory() as tmp:
        src = pathlib.Path(tmp, "src")
        dst = pathlib.Path(tmp, "dst")
        (src / "towerps" / "proto").mkdir(parents=True)
        dst.mkdir()
        shutil.copy(PROTO, src / "towerps" / "proto" / PROTO.name)
        code = protoc.main([
            "grpc_tools.protoc",
            f"-I{src}",
            f"--python_out={dst}",
            f"--pyi_out={dst}",
            f"--grpc_python_out={dst}",
            "towerps/proto/towerps.proto",
        ])
        if code != 0:
            raise SystemExit(f"protoc failed with exit code {code}")
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for name in GENERATED:
            target = out_dir / name
            shutil.copy(dst / "towerps" / "proto" / name, target)
            written.append(target)
        return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=PROTO.parent)
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
