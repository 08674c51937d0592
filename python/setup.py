"""Builds the fusor package, generating its gRPC stubs from the repository's proto/.

The stubs (fusor/v1/*_pb2.py, *_pb2_grpc.py and the .pyi type stubs) are
generated into the build directory by grpcio-tools from ../proto, so they
cannot drift from the wire contract. The package requires grpcio and protobuf
at least as new as the versions the stubs were generated for: both runtimes
refuse older versions at import time, and pip should say so at install time.
"""

import re
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
PROTO_DIR = HERE.parent / "proto"
PROTOS = sorted(str(p.relative_to(PROTO_DIR)) for p in (PROTO_DIR / "fusor" / "v1").glob("*.proto"))


def generate_stubs(out_dir: Path) -> None:
    if not PROTOS:
        sys.exit(f"fusor: no .proto files under {PROTO_DIR}; build the package from a fusor source tree (pip install ./python)")
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO_DIR}", f"--python_out={out_dir}",
           f"--pyi_out={out_dir}", f"--grpc_python_out={out_dir}", *PROTOS]
    subprocess.run(cmd, check=True)


def generated_versions() -> tuple:
    """The protobuf and grpcio versions the stubs are generated for, read from a stub generated now."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        generate_stubs(Path(tmp))
        pb2 = (Path(tmp) / "fusor" / "v1" / "scheduler_pb2.py").read_text()
        grpc_stub = (Path(tmp) / "fusor" / "v1" / "scheduler_pb2_grpc.py").read_text()
    found = re.search(r"ValidateProtobufRuntimeVersion\(\s*[\w.]+,\s*(\d+),\s*(\d+),\s*(\d+)", pb2)
    if found:
        protobuf = tuple(int(x) for x in found.groups())
    else:  # older generators: no runtime check; the bundled protobuf is the floor
        import google.protobuf

        protobuf = tuple(int(x) for x in re.findall(r"\d+", google.protobuf.__version__)[:3])
    found = re.search(r"GRPC_GENERATED_VERSION = '([\d.]+)'", grpc_stub)
    grpcio = found.group(1) if found else "1.62"
    return protobuf, grpcio


class BuildPyWithStubs(build_py):
    def run(self) -> None:
        super().run()
        # An editable install imports from src/, so the stubs go there.
        target = HERE / "src" if getattr(self, "editable_mode", False) else Path(self.build_lib)
        generate_stubs(target)
        # The source tree this package was built from: the embedded mode
        # looks for the scheduler and worker built there (build/).
        (target / "fusor" / "_source_tree.txt").write_text(str(HERE.parent) + "\n")


def dependencies() -> list:
    protobuf, grpcio = generated_versions()
    return [
        f"grpcio>={grpcio}",
        f"protobuf>={'.'.join(map(str, protobuf))},<{protobuf[0] + 1}",
        "numpy>=1.21",
    ]


setup(cmdclass={"build_py": BuildPyWithStubs}, install_requires=dependencies())
