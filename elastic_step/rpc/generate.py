"""Regenerates the gRPC code next to the .proto files: ``make proto``.
Tests: none in tests/ (a developer's tool)."""

import pathlib
import sys

from grpc_tools import protoc

ROOT = pathlib.Path(__file__).resolve().parents[2]


def main() -> int:
    protos = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "elastic_step/rpc").glob("*.proto"))
    include = pathlib.Path(protoc.__file__).parent / "_proto"
    args = ["protoc", f"-I{ROOT}", f"-I{include}", f"--python_out={ROOT}", f"--pyi_out={ROOT}"]
    args += [f"--grpc_python_out={ROOT}", *protos]
    return protoc.main(args)


if __name__ == "__main__":
    sys.exit(main())
