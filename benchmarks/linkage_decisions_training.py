"""Training on linkage decisions: FedSim, Top1Sim and Exact on FEBRL with the links of a
Fellegi–Sunter model against today's weighted field distances. One JSON object per run.

Tasks ("febrl" dataset, synthetic label whose signal is split between the parties):
  febrl       FEBRL4, every primary record has its counterpart (overlap 1.0)
  unmatched   the same people with overlap 0.5: half of each side's records have no
              counterpart (the label still needs the secondary's features)

Linkages (private, keyed Bloom filters, the same blocking rules, K = 10):
  distance    today: every field compared by Dice distance, weight 1, FedSim's similarity is
              the Eq. 1-2 normalised and noised weighted distance; Top1Sim takes the nearest
              record, Exact the records at distance 0 (all fields equal)
  model       model = "fellegi-sunter", one_to_one = true: FedSim's similarity is the noised,
              normalised match weight; Top1Sim takes the record's match first; Exact takes the
              one-to-one matches only (records without one are handled as unmatched)

Reported per run: the test AUC, the share of primary records with a link (``matched_fraction``:
for Exact, the records it could train with their counterpart's features) and the model's
label-free estimates.

Usage: python benchmarks/linkage_decisions_training.py [--task febrl|unmatched|all]
           [--algorithms fedsim,top1sim,exact] [--seeds 0] [--epochs 10]
           [--linkages distance,model]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

FIELDS = ("given_name", "surname", "street_number", "address_1", "address_2", "suburb",
          "postcode", "state", "date_of_birth")
RULES = (("given_name", "surname"), ("surname", "date_of_birth"),
         ("given_name", "date_of_birth"), ("postcode", "street_number"),
         ("suburb", "address_1"), ("postcode", "surname"), ("postcode", "given_name"),
         ("date_of_birth", "suburb"), ("address_1", "address_2"))
TASKS = {"febrl": 1.0, "unmatched": 0.5}


def config(task: str, linkage: str, algorithm: str, seed: int, epochs: int) -> dict[str, Any]:
    fields = [{"on": [c], **({} if linkage == "model" else {"metric": "jaro-winkler"})}
              for c in FIELDS]
    alignment: dict[str, Any] = {"method": "soft", "top_k": 10, "fields": fields,
                                 "blocking": [{"on": list(r)} for r in RULES],
                                 "unmatched": "keep"}
    if linkage == "model":
        alignment.update(model="fellegi-sunter", one_to_one=True)
    return {"version": 1, "seed": seed, "algorithm": algorithm,
            "data": {"dataset": "febrl", "options": {"overlap": TASKS[task], "seed": seed,
                                                     "secondary_signal": 0.6}},
            "alignment": alignment,
            "training": {"epochs": epochs, "patience": 3, "batch_size": 128,
                         "knn_batch_size": 32, "optimizer": "lamb", "lr": 0.003}}


def main(argv: list[str] | None = None) -> int:
    import vflink

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=(*TASKS, "all"), default="all")
    parser.add_argument("--algorithms", default="fedsim,top1sim,exact")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--linkages", default="distance,model")
    args = parser.parse_args(argv)
    tasks = list(TASKS) if args.task == "all" else [args.task]
    with tempfile.TemporaryDirectory() as tmp:
        for task in tasks:
            for seed in map(int, args.seeds.split(",")):
                for algorithm in args.algorithms.split(","):
                    for linkage in args.linkages.split(","):
                        clock = time.perf_counter()
                        run = vflink.train(config(task, linkage, algorithm, seed, args.epochs),
                                           out=Path(tmp) / f"{task}-{algorithm}-{linkage}-{seed}")
                        a = run.result.extra.get("alignment", {})
                        print(json.dumps({
                            "task": task, "linkage": linkage, "algorithm": algorithm,
                            "seed": seed, "test_auc": round(run.metrics["test"]["auc"], 4),
                            "matched_fraction": a.get("matched_fraction"),
                            "model": a.get("model"), "seconds": round(
                                time.perf_counter() - clock, 1)}))
                        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
