"""Prints a short table of the JSON files a device run wrote (used at the end of a device command)."""

import json
import sys

for path in sys.argv[1:]:
    try:
        data = json.load(open(path))
    except Exception as exc:  # a failed step leaves no JSON: say so and go on
        print(f"{path}: unreadable ({exc})")
        continue
    if data.get("bench") == "mla_decode":
        print(
            f"{path}: ceiling {data['ceiling_tbps']:.2f} TB/s met={data['met']} by split "
            f"floor={data.get('met_by_split_floor')}"
        )
        for c in data["cases"]:
            print(
                f"  {c['batch']:>4}x{c['kv_len']:<7} {c['mode']:<12} {c['ms'] * 1e3:9.1f} us {c['kv_tbps']:.2f} TB/s "
                f"ratio={c['ratio_to_ceiling']:.2f} of_gather={c['ratio_to_gather_ceiling']:.2f} "
                f"x_torch={c['speedup_vs_torch'] or 0:.1f} rel={c['rel_l2'] or 0:.1e}"
            )
        for shape, info in data["per_shape"].items():
            floor = info.get("split_floor", {})
            print(
                f"  {shape}: gather ceiling {info['gather_ceiling']['ms'] * 1e3:.1f} us, fixed cost "
                f"{info['fixed_cost_ms'] * 1e3:.1f} us, split floor {floor.get('ms', 0) * 1e3:.1f} us "
                f"{floor.get('config')}, kernel-shaped {floor.get('kernel_structure', {}).get('ms', 0) * 1e3:.1f} us"
            )
        for shape, rows in data.get("split_sweep", {}).items():
            print(f"  splits {shape}: " + " ".join(f"{r['splits']}:{r['ms'] * 1e3:.1f}us" for r in rows))
        for shape, rows in data.get("sweep", {}).items():
            best = sorted((r for r in rows if "ms" in r), key=lambda r: r["ms"])[:5]
            for r in best:
                c = r["config"]
                print(
                    f"  sweep {shape}: bn={c['block_n']} w={c['num_warps']} st={c['num_stages']} "
                    f"d_chunk={c['d_chunk']} ratio={r['ratio_to_ceiling']:.2f} regs={r.get('registers')} "
                    f"spills={r.get('spills')}"
                )
            for r in [r for r in rows if "ms" in r][:: max(1, len(rows) // 8)]:
                c = r["config"]
                print(
                    f"    sample: bn={c['block_n']} w={c['num_warps']} st={c['num_stages']} d_chunk={c['d_chunk']} "
                    f"ratio={r['ratio_to_ceiling']:.2f} regs={r.get('registers')} spills={r.get('spills')}"
                )
    else:
        print(f"{path}: result={data.get('result')} seconds={data.get('seconds')} problems={data.get('problems')}")
        for gpu in data.get("gpus", []):
            print(f"  {gpu['device']} {gpu['result']} speedup={gpu['speedup']}")
            for path_name, info in gpu["paths"].items():
                for reason in info["reasons"]:
                    print(f"    {path_name}: {reason}")
                child = info["child"] or {}
                for t in child.get("timing", []):
                    print(
                        f"    {path_name} {t['case']} {t['ms'] * 1e3:.1f} us ratio={t.get('ratio_to_ceiling', 0):.2f}"
                    )
                for g in child.get("graph", []):
                    print(f"    {path_name} graph ratio={g['ratio']} replays={g['replays']}")
                print(f"    {path_name} peak_mem={child.get('peak_memory_bytes')} child_s={info['child_seconds']}")
