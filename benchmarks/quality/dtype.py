"""What a lower-precision dtype changes in the answers: the same labelled questions answered in float32 and in
another dtype (default bfloat16), same model, same options; top-answer agreement, |Δp|, and accuracy of each.

    python -m benchmarks.quality.dtype out/heldout-families-test.jsonl
    python -m benchmarks.quality.dtype out/heldout-families-test.jsonl --readout out/readout-smollm2
"""

from __future__ import annotations

import argparse
import json
import statistics

from prefill import Prefill
from prefill.evaluation.evaluate import load_jsonl, predict


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data")
    ap.add_argument("--model", default=None)
    ap.add_argument("--readout", default=None)
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args()
    items = load_jsonl(args.data)
    runs = {}
    for dtype in ("float32", args.dtype):
        pf = Prefill(args.model, dtype=dtype, facts=False, readout=args.readout)
        runs[dtype] = predict(pf.engine, items)
        del pf
    base, low = runs["float32"], runs[args.dtype]
    top = lambda p: max(range(len(p)), key=p.__getitem__)  # noqa: E731
    deltas = [max(abs(a - b) for a, b in zip(x.probs, y.probs)) for x, y in zip(base, low)]
    result = {
        "data": args.data,
        "readout": args.readout,
        "questions": len(base),
        "dtype": args.dtype,
        "top_answer_agreement": round(sum(top(x.probs) == top(y.probs) for x, y in zip(base, low)) / len(base), 4),
        "max_abs_dp": round(max(deltas), 4),
        "mean_max_abs_dp": round(statistics.mean(deltas), 4),
        "accuracy_float32": round(sum(top(x.probs) == x.gold for x in base) / len(base), 4),
        f"accuracy_{args.dtype}": round(sum(top(y.probs) == y.gold for y in low) / len(low), 4),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
