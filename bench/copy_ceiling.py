"""Device copy bandwidth by several methods (read+write bytes / time), to pick an honest ceiling. JSON."""

import json

import torch

from gluon_agent.selftest import timing


def size_rows(device: torch.device, gib: float) -> list[dict]:
    """Every method at one size; its buffers are freed when this returns, before the next size allocates."""
    n = int(gib * 2**30)
    src = torch.empty(n, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    src32, dst32 = src.view(torch.float32), dst.view(torch.float32)
    rows = []
    for name, call in (
        ("graph uint8 copy_", lambda: dst.copy_(src)),
        ("graph float32 copy_", lambda: dst32.copy_(src32)),
        ("graph float32 add", lambda: torch.add(src32, 0.0, out=dst32)),
    ):
        ms = timing.graph_ms_per_call([call])
        rows.append({"gib": gib, "method": name, "ms": ms, "tbps": timing.tbps(2 * n, ms)})
    ms = timing.eager_ms(lambda: dst.copy_(src))
    rows.append({"gib": gib, "method": "eager uint8 copy_", "ms": ms, "tbps": timing.tbps(2 * n, ms)})
    return rows


def main() -> None:
    device = torch.device("cuda:0")
    rows = [row for gib in (0.5, 1, 4) for row in size_rows(device, gib)]
    print(json.dumps({"bench": "copy_ceiling", "gpu": torch.cuda.get_device_name(device), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
