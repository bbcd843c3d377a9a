"""The committed generated code must be exactly what the pinned grpcio-tools makes from protos/."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_generated_code_is_up_to_date(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "tools" / "gen_protos.py"), str(tmp_path)], check=True,
                   capture_output=True, timeout=120)
    committed = ROOT / "wantrain" / "transport" / "proto"
    made = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert made, "the generator wrote nothing"
    have = sorted(p.relative_to(committed) for p in committed.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    assert made == have
    for rel in made:
        assert (tmp_path / rel).read_text() == (committed / rel).read_text(), f"{rel} differs: run `make protos`"


def test_every_proto_field_is_commented():
    for proto in (ROOT / "protos").rglob("*.proto"):
        lines = proto.read_text().splitlines()
        for i, line in enumerate(lines):
            s = line.strip()
            if "=" in s and s.endswith(";") and not s.startswith(("//", "syntax", "package", "option")):
                if s.split()[0] in ("Join", "Chunk", "RoundMetrics", "HashReport", "Welcome", "RoundStart", "RoundResult",
                                    "Error", "LinkProbe", "Ready", "DeltaOutcome", "DeltaManifest", "DeltaParity",
                                    "LaneOpen", "LaneAck") \
                        and "oneof" in "".join(lines[max(0, i - 10):i]):
                    continue  # oneof alternatives are documented by their message type
                assert lines[i - 1].strip().startswith("//"), f"{proto.name}:{i + 1} has no comment: {s}"
