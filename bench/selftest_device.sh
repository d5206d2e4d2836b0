#!/usr/bin/env bash
# The GPU self-test record of docs/benchmarks/ (aiter stand-in and portable kernel), on a CUDA machine:
#   OUT=dir bash bench/selftest_device.sh
# Writes capture_check_h200.json, selftest_h200_{aiter_cold,aiter_warm,aiter_q8,triton_cold,triton_warm}.json
# and log.txt: the machine, each command's exit code and wall time, and per run and child the phase
# times (imports, prewarm, wait, steps) and peak GPU memory. The Triton cache is emptied first, so
# aiter_cold and triton_cold are the first runs of their kind (the aiter stand-in compiles no Triton).
set -u; export PYTHONUNBUFFERED=1
FA=localcluster/gluon_localcluster/fakes/aiter_stack
export PYTHONPATH=$FA:common:agent
LOG=$OUT/log.txt
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch,triton,sys;print('torch',torch.__version__,'triton',triton.__version__,'python',sys.version.split()[0])"; } > $LOG 2>&1
python3 bench/capture_check.py > $OUT/capture_check_h200.json 2>>$LOG; echo "capture_check rc=$?" >> $LOG
rm -rf ~/.triton/cache

selftest() {  # NAME ARGS...: one self-test, its JSON as selftest_h200_NAME.json
  local name=$1; shift
  /usr/bin/time -a -o $LOG -f "$name: %e s wall" python3 -m gluon_agent selftest --json "$@" > $OUT/selftest_h200_$name.json 2>>$LOG
  echo "$name rc=$?" >> $LOG
}
selftest aiter_cold --backends aiter
selftest aiter_warm --backends aiter
selftest aiter_q8 --backends aiter --serving-config '{"verifyQLens":[8]}'
selftest triton_cold --backends triton
selftest triton_warm --backends triton

python3 - "$OUT" >> $LOG 2>&1 <<'PY'
import json, sys
out = sys.argv[1]
for name in ("aiter_cold", "aiter_warm", "aiter_q8", "triton_cold", "triton_warm"):
    try:
        report = json.load(open(f"{out}/selftest_h200_{name}.json"))
    except Exception as exc:  # noqa: BLE001
        print(name, "unreadable:", exc)
        continue
    gpu = report["gpus"][0]
    print(f"== {name}: {report['result']} in {report['seconds']} s; speedup {gpu['speedup']}")
    for path, info in gpu["paths"].items():
        child = info["child"] or {}
        peak = child.get("peak_memory_bytes")
        peak = f"{peak / 2**30:.3f} GiB" if peak else "-"
        print(f"  {path}: {info['result']}, child {info['child_seconds']} s (import {child.get('import_seconds')}, "
              f"prewarm {child.get('prewarm_seconds')}, waited {child.get('waited_seconds')}, work {child.get('seconds')}), "
              f"peak {peak}")
        steps = sorted((child.get("step_seconds") or {}).items(), key=lambda kv: -kv[1])
        print("    steps:", ", ".join(f"{k} {v}" for k, v in steps))
        for g in child.get("graph", []):
            print(f"    graph: replay {g['replay_ms']:.3f} ms, eager {g['eager_ms']:.3f} ms, violations {g['capture_violations']}")
        for t in child.get("timing", []):
            print(f"    timing {t['case']}: {t['ms']:.3f} ms")
        for reason in info["reasons"][:3]:
            print("    reason:", reason[:400])
PY
