"""One probe check, run inside the *probed* interpreter (any Python >= 3.8, stdlib only).

`probe.py` runs this file's source with `python -c SOURCE CHECK` in a child process per check, so an
import that raises, aborts, segfaults or hangs only ends that child. The result is the last stdout line
that starts with RESULT_MARKER: imported packages may print anything before it.
"""

import errno
import inspect
import json
import os
import re
import sys

RESULT_MARKER = "GLUON_PROBE_RESULT "
AITER_DISTS = ("amd-aiter", "aiter")
TRITON_DISTS = ("triton", "pytorch-triton-rocm", "triton-rocm")
TORCH_DISTS = ("torch",)
SGLANG_DISTS = ("sglang",)
SGLANG_ATTENTION = ("srt", "layers", "attention")
# sgl-project/sglang PR #37438's init-time guard in aiter_backend.py (at 003c5589): persistent MLA is
# turned off only when Gluon is selected.
FLAG0_GUARD = re.compile(r"if\s+prefer_mla_gluon_decode\(\s*head_pad_mode\s*=")
# PR #37601: mla_gluon_decode(..., qlen: int = 1) routes q_len > 1 through mla_gluon.
MTP_QLEN = re.compile(r"def\s+mla_gluon_decode\([^)]*\bqlen\b", re.S)


KFD = "/dev/kfd"  # ROCm's compute interface, shared by every GPU of the node


def describe(exc):
    return "%s: %s" % (type(exc).__name__, exc)


def dist_version(names):
    """Installed distribution version without importing the package (None when absent)."""
    try:
        from importlib import metadata
    except ImportError:  # Python < 3.8
        return None
    for name in names:
        try:
            return metadata.version(name)
        except Exception:
            continue
    return None


def read_first_line(path):
    try:
        with open(path) as handle:
            return handle.readline().strip() or None
    except OSError:
        return None


def device_access(path):
    """'absent', 'ok', or the error opening it: on a standard container runtime the device cgroup answers
    EPERM to a container that holds neither privilege nor a device plugin's allocation of the device."""
    if not os.path.exists(path):
        return "absent"
    try:
        os.close(os.open(path, os.O_RDWR))
    except OSError as exc:
        return "denied (%s)" % (errno.errorcode.get(exc.errno) or exc.errno)
    return "ok"


def check_meta():
    """Versions from package metadata and the kernel driver: cheap and safe, never imports the stack."""
    import platform

    return {
        "python_version": platform.python_version(),
        "aiter_version": dist_version(AITER_DISTS),
        "triton_dist_version": dist_version(TRITON_DISTS),
        "torch_dist_version": dist_version(TORCH_DISTS),
        "driver_version": read_first_line("/sys/module/amdgpu/version")
        or read_first_line("/sys/module/nvidia/version"),
        "kfd_access": device_access(KFD),
    }


def check_aiter():
    """SGLang's import of the Gluon kernel. Any exception type counts (aiter raises RuntimeError on old Triton)."""
    try:
        from aiter.ops.triton.gluon.mla_gluon import mla_gluon  # noqa: F401
    except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyboardInterrupt are failures too
        # SGLang catches only ImportError: anything else stops its serving process with the flag on
        return {
            "import_ok": False,
            "import_error": describe(exc),
            "import_error_is_importerror": isinstance(exc, ImportError),
        }
    aiter = sys.modules.get("aiter")
    return {"import_ok": True, "import_error": None, "aiter_module_version": getattr(aiter, "__version__", None)}


def check_triton():
    """Whether Gluon's PaddedSharedLayout takes cga_layout (Triton >= 3.7); a version check alone is wrong."""
    try:
        import triton
    except BaseException as exc:  # noqa: BLE001
        return {"triton_version": None, "triton_cga_layout_ok": False, "triton_error": describe(exc)}
    version = getattr(triton, "__version__", None) or dist_version(TRITON_DISTS)
    try:
        import triton.experimental.gluon.language as gl

        params = inspect.signature(gl.PaddedSharedLayout).parameters
    except BaseException as exc:  # noqa: BLE001
        return {"triton_version": version, "triton_cga_layout_ok": False, "triton_error": describe(exc)}
    return {"triton_version": version, "triton_cga_layout_ok": "cga_layout" in params, "triton_error": None}


def gpu_facts(torch, index):
    props = torch.cuda.get_device_properties(index)
    arch = getattr(props, "gcnArchName", None)
    if arch:
        arch = arch.split(":")[0]  # "gfx950:sramecc+:xnack-" -> "gfx950"
    else:
        arch = "sm_%d%d" % (props.major, props.minor)
    return {
        "index": index,
        "name": props.name,
        "arch": arch,
        "memory_bytes": int(props.total_memory),
        "uuid": str(getattr(props, "uuid", "") or "") or None,
    }


def fp8_roundtrip_ok(torch, device):
    """float8_e4m3fn exists and a bf16 -> e4m3fn -> bf16 round trip keeps exact representable values."""
    dtype = getattr(torch, "float8_e4m3fn", None)
    if dtype is None:
        return False
    values = torch.tensor([1.0, -2.0, 0.5, 448.0], dtype=torch.bfloat16, device=device)
    back = values.to(dtype).to(torch.bfloat16)
    return bool(torch.equal(back, values))


def check_torch():
    try:
        import torch
    except BaseException as exc:  # noqa: BLE001
        return {"torch_version": None, "torch_error": describe(exc), "gpus": [], "fp8_e4m3fn_ok": False}
    version = getattr(torch, "version", None)
    facts = {
        "torch_version": getattr(torch, "__version__", None),
        "hip_version": getattr(version, "hip", None),
        "cuda_version": getattr(version, "cuda", None),
        "torch_error": None,
        "gpus": [],
        "fp8_e4m3fn_ok": False,
    }
    try:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        facts["gpus"] = [gpu_facts(torch, i) for i in range(count)]
        devices = ["cuda:%d" % i for i in range(count)] or ["cpu"]
        facts["fp8_e4m3fn_ok"] = all(fp8_roundtrip_ok(torch, d) for d in devices)
    except BaseException as exc:  # noqa: BLE001
        facts["torch_error"] = describe(exc)
    return facts


def read_text(path):
    try:
        with open(path) as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError):
        return None


def check_sglang():
    """The installed SGLang's version and the source of its aiter decode routes, read as text: importing
    sglang would take seconds and initialise half of it."""
    facts = {"sglang_version": dist_version(SGLANG_DISTS), "source_found": False}
    try:
        import importlib.util

        spec = importlib.util.find_spec("sglang")  # a top-level find_spec runs no package code
    except BaseException as exc:  # noqa: BLE001
        facts["sglang_error"] = describe(exc)
        return facts
    roots = list(getattr(spec, "submodule_search_locations", None) or []) if spec else []
    for root in roots:
        attention = os.path.join(root, *SGLANG_ATTENTION)
        backend = read_text(os.path.join(attention, "aiter_backend.py"))
        if backend is None:
            continue
        gluon = read_text(os.path.join(attention, "aiter_mla_gluon.py"))
        facts.update(
            source_found=True,
            source_dir=attention,
            gluon_module=gluon is not None,
            flag0_persistent_guard=bool(FLAG0_GUARD.search(backend)),
            mtp_qlen=bool(gluon and MTP_QLEN.search(gluon)),
        )
        break
    return facts


CHECKS = {
    "meta": check_meta,
    "aiter": check_aiter,
    "triton": check_triton,
    "torch": check_torch,
    "sglang": check_sglang,
}


def main(argv):
    if len(argv) != 1 or argv[0] not in CHECKS:
        sys.stderr.write("usage: probe_child {%s}\n" % ",".join(sorted(CHECKS)))
        return 2
    result = CHECKS[argv[0]]()
    sys.stdout.flush()
    sys.stdout.write("\n" + RESULT_MARKER + json.dumps(result, sort_keys=True) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip the interpreter's teardown: with torch and a CUDA context loaded it takes most of a second,
    # and the self-test children wait for the probe (the driver frees the GPU at exit either way).
    os._exit(code)
