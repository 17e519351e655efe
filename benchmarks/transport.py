"""Per-epoch time of the same FedSim run over the in-process and the gRPC transport.

The gRPC run has three processes on 127.0.0.1 with mutual TLS, as in a deployment: this process
is the primary, and `vflink serve` runs the coordinator and the secondary. Prints JSON with the
sizes, the per-epoch seconds and payload bytes of each transport, and the ratio gRPC/in-process
(the in-process run is the baseline, measured in the same process).

    python benchmarks/transport.py                 # sklearn, 20,000 rows, K = 50, 2 epochs
    python benchmarks/transport.py --samples 5000 --k 10 --epochs 1
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from vflink.runfiles.config import (  # noqa: E402
    AlignmentConfig,
    DataConfig,
    PrivacyConfig,
    RunConfig,
    TrainingConfig,
)
from vflink.runfiles.inputs import Inputs, load_inputs  # noqa: E402
from vflink.runfiles.party import load_party_config  # noqa: E402
from vflink.runner.network import network_federation  # noqa: E402
from vflink.runner.train import run_training  # noqa: E402
from vflink.transport.grpc import create_dev_pki  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def party_files(tmp: Path, options: dict[str, object], seed: int) -> dict[str, Path]:
    certs = tmp / "certs"
    create_dev_pki(certs, ["primary", "secondary", "coordinator"])
    cp, sp = free_port(), free_port()
    opts = "\n".join(f"{k} = {v!r}" for k, v in options.items())
    sec = f'[security]\ntls_dir = "{certs}"\n'
    # The in-process run sends raw identifiers without noise (privacy = "off"); across hosts
    # every party must opt out in its own file for the same run (each party has its own policy).
    raw = '[policy]\nidentifiers = "any"\n'
    files = {name: tmp / f"{name}.toml" for name in ("coordinator", "secondary", "primary")}
    files["coordinator"].write_text(
        f'version = 1\n[party]\nname = "coordinator"\nrole = "coordinator"\n'
        f'listen = "127.0.0.1:{cp}"\nseed = {seed}\n{sec}allowed = ["primary", "secondary"]\n'
        f'roles = {{ primary = "primary", secondary = "secondary" }}\n[policy]\nmax_tau = 1.0\n')
    files["secondary"].write_text(
        f'version = 1\n[party]\nname = "secondary"\nrole = "secondary"\n'
        f'listen = "127.0.0.1:{sp}"\nstate_dir = "{tmp / "state"}"\ndataset = "sklearn"\n'
        f'[party.options]\n{opts}\n[peers.coordinator]\naddress = "127.0.0.1:{cp}"\n'
        f'role = "coordinator"\n{sec}allowed = ["primary"]\n{raw}')
    files["primary"].write_text(
        f'version = 1\n[party]\nname = "primary"\nrole = "primary"\ndataset = "sklearn"\n'
        f'[party.options]\n{opts}\n[peers.coordinator]\naddress = "127.0.0.1:{cp}"\n'
        f'role = "coordinator"\n[peers.secondary]\naddress = "127.0.0.1:{sp}"\n'
        f'role = "secondary"\n{sec}{raw}')
    return files


def serve(path: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as handle:
        proc = subprocess.Popen([sys.executable, "-m", "vflink.cli.main", "serve", "--config",
                                 str(path)], stdout=handle, stderr=subprocess.STDOUT)
    port = int(load_party_config(path).listen.rsplit(":", 1)[1])  # type: ignore[union-attr]
    for _ in range(300):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc
        time.sleep(0.2)
    raise RuntimeError(f"{path} did not start: {log.read_text()}")


def summary(result) -> dict[str, object]:  # type: ignore[no-untyped-def]
    epochs = result.history
    return {"epoch_seconds": [round(e.seconds, 3) for e in epochs],
            "mean_epoch_seconds": round(sum(e.seconds for e in epochs) / len(epochs), 3),
            "bytes_per_epoch": [sum(v["bytes"] for v in e.communication.values())
                                for e in epochs],
            "messages_per_epoch": [sum(v["messages"] for v in e.communication.values())
                                   for e in epochs],
            "test_accuracy": round(result.metrics["test"]["accuracy"], 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--k", type=int, default=50)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    os.environ.setdefault("VFLINK_SECRET", "benchmark-secret-shared-by-data-parties")
    options = {"n_samples": args.samples, "sigma_cf": 0.2, "seed": 0}
    config = RunConfig(seed=0, algorithm="fedsim",
                       data=DataConfig(dataset="sklearn", options=dict(options)),
                       alignment=AlignmentConfig(method="soft", top_k=args.k, privacy="off"),
                       training=TrainingConfig(epochs=args.epochs, patience=args.epochs,
                                               knn_batch_size=args.batch, optimizer="lamb",
                                               lr=3e-3, threads=1),
                       privacy=PrivacyConfig(labels="off"))
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        local = run_training(config, tmp / "inprocess")
        files = party_files(tmp, options, seed=0)
        procs = [serve(files["coordinator"], tmp / "c.log"),
                 serve(files["secondary"], tmp / "s.log")]
        try:
            federation = network_federation(load_party_config(files["primary"]), run_id="grpc")
            try:
                inputs = load_inputs(config)
                remote = run_training(config, tmp / "grpc", federation=federation,
                                      tables=Inputs(inputs.primary, ()))
            finally:
                federation.close()
        finally:
            for p in procs:
                p.terminate()
                p.wait(10)
    a, b = summary(local), summary(remote)
    print(json.dumps({
        "benchmark": "transport", "dataset": "sklearn", "primary_rows": args.samples,
        "secondary_rows": args.samples, "k": args.k, "batch": args.batch,
        "algorithm": "fedsim", "epochs": args.epochs,
        "inprocess": a, "grpc_mtls_loopback_3_processes": b,
        "ratio_grpc_vs_inprocess": round(float(b["mean_epoch_seconds"])  # type: ignore[arg-type]
                                         / float(a["mean_epoch_seconds"]), 3),  # type: ignore[arg-type]
        "same_payload_bytes": a["bytes_per_epoch"] == b["bytes_per_epoch"],
        "same_test_metric": a["test_accuracy"] == b["test_accuracy"],
        "peak_rss_gib_primary": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                                      / 2**20, 3),
    }, indent=2))


if __name__ == "__main__":
    main()
