#!/usr/bin/env bash
# The GPU self-test record of docs/benchmarks/ (aiter stand-in and portable kernel), on a CUDA machine:
#   OUT=dir bash bench/selftest_device.sh
set -u; export PYTHONUNBUFFERED=1
FA=localcluster/gluon_localcluster/fakes/aiter_stack
export PYTHONPATH=$FA:agent
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/machine.txt; python3 -c "import torch,triton,sys;print(torch.__version__,triton.__version__,sys.version.split()[0])" >> $OUT/machine.txt
python3 bench/capture_check.py > $OUT/capture_check_h200.json; echo "capture rc=$?"
rm -rf ~/.triton/cache
/usr/bin/time -f "%e s wall" python3 -m gluon_agent selftest --json --backends aiter > $OUT/selftest_h200_aiter_cold.json 2>$OUT/cold.err; echo "cold rc=$?"; tail -1 $OUT/cold.err
/usr/bin/time -f "%e s wall" python3 -m gluon_agent selftest --json --backends aiter > $OUT/selftest_h200_aiter_warm.json 2>$OUT/warm.err; echo "warm rc=$?"; tail -1 $OUT/warm.err
/usr/bin/time -f "%e s wall" python3 -m gluon_agent selftest --json --backends aiter --serving-config '{"verifyQLens":[8]}' > $OUT/selftest_h200_aiter_q8.json 2>$OUT/q8.err; echo "q8 rc=$?"; tail -1 $OUT/q8.err
/usr/bin/time -f "%e s wall" python3 -m gluon_agent selftest --json --backends triton > $OUT/selftest_h200_triton_warm.json 2>$OUT/tr.err; echo "triton rc=$?"; tail -1 $OUT/tr.err
python3 - <<'PY'
import json,os
o=os.environ["OUT"]
for n in ("aiter_cold","aiter_warm","aiter_q8","triton_warm"):
    try: d=json.load(open(f"{o}/selftest_h200_{n}.json"))
    except Exception as e: print(n,"unreadable",e); continue
    g=d["gpus"][0]
    print(n, d["result"], d["seconds"], g["result"], [ (p, (g["paths"][p]["child"] or {}).get("peak_memory_bytes")) for p in g["paths"]], g["speedup"])
    for p in g["paths"]:
        for r in g["paths"][p]["reasons"][:3]: print("   ",p,r[:300])
PY
