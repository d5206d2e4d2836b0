"""The self-test pod's code as it runs in a serving image: installed by the agent image into a shared folder,
then run by a foreign interpreter (a bare venv: the stdlib, plus the image's torch and Triton and the fake
aiter) that has none of the agent's own dependencies. Its termination message is a PodProof within
PROOF_MESSAGE_LIMIT bytes whatever happens: a pass, a crash, no GPU, the deadline, SIGTERM."""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import sysconfig
import textwrap
import time
import venv
from pathlib import Path

import pytest

from gluon_agent import daemon, preflight, selftest_pod
from gluon_agent.fingerprint import fingerprint
from gluon_common import contract, report
from gluon_common.report import GpuResult, PodProof, Probe, SelfTest
from gluon_common.sglang_routes import DEFAULT_SERVING, ServingConfig
from gluon_localcluster.fakes.simulated import simulated_node, simulated_selftest
from gluon_localcluster.fakes.stacks import AITER_STACK

CHECKOUT = Path(__file__).resolve().parent.parent
# What a serving image lacks: the agent's own dependencies and the harness. Importing one fails in the child.
ABSENT = ("pydantic", "prometheus_client", "kubernetes", "kopf", "gluon_operator", "gluon_localcluster")
STACK_MODULES = {"torch", "triton", "aiter"}  # the serving image's own, imported only by the self-test's children


# ---------------------------------------------------------------- the install and the copied tree


@pytest.fixture(scope="module")
def installed_copy(tmp_path_factory) -> Path:
    """The pod's emptyDir after the install init container ran, through its exact command line."""
    target = tmp_path_factory.mktemp("pod") / "gluon"
    done = subprocess.run(
        [sys.executable, "-m", "gluon_agent", "selftest-pod", "--install", str(target)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return target


def copied_modules(copy: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module under the copy's lib/."""
    out = {}
    for path in (copy / "lib").rglob("*.py"):
        parts = path.relative_to(copy / "lib").with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports_of(module: str, path: Path) -> set[str]:
    """Every module `module`'s file imports, at module level or inside functions, as absolute names."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            names.add(target)
            names.update(f"{target}.{alias.name}" for alias in node.names)
    return names


def test_the_install_copies_the_preflight_and_the_selftest(installed_copy):
    copied = sorted(str(p.relative_to(installed_copy / "lib")) for p in (installed_copy / "lib").rglob("*.py"))
    assert copied == sorted(relative for _, relative in preflight.portable_sources(selftest_pod.SELFTEST_POD_MODULES))
    assert {relative for _, relative in preflight.portable_sources()} <= set(copied)  # the preflight's own set
    assert {"gluon_agent/selftest_pod.py", "gluon_agent/selftest/worker.py", "gluon_agent/sources.py"} <= set(copied)
    assert not (installed_copy / contract.FLAG_FILE).exists()  # no flag file: this is no serving pod


def test_the_copied_set_is_closed_under_its_imports(installed_copy):
    """Each copied module imports only copied modules of ours, the stdlib, and the image's torch stack: a
    module added to the self-test without being added to SELFTEST_POD_MODULES fails here, not in a pod."""
    modules = copied_modules(installed_copy)
    ours = ("gluon_agent", "gluon_common")
    for module, path in modules.items():
        for name in imports_of(module, path):
            top = name.split(".")[0]
            if top in ours:
                # `from pkg import name` may name an attribute, not a module: only a module must be copied
                parent = name.rpartition(".")[0]
                assert name in modules or parent in modules, f"{module} imports {name}, which is not copied"
                if name not in modules:
                    assert not (preflight.package_folder(parent) / f"{name.rpartition('.')[2]}.py").exists(), (
                        f"{module} imports the module {name}, which is not copied"
                    )
            else:
                assert top in sys.stdlib_module_names or top in STACK_MODULES, f"{module} imports {name}"


def test_the_contract_names_this_module_and_the_report_limits_agree():
    import importlib.util

    spec = importlib.util.find_spec(contract.SELFTEST_POD_MODULE)
    assert spec is not None and Path(spec.origin) == Path(selftest_pod.__file__)
    assert selftest_pod.PROOF_MESSAGE_LIMIT == report.PROOF_MESSAGE_LIMIT
    assert selftest_pod.REPORT_SCHEMA_VERSION == report.REPORT_SCHEMA_VERSION


@pytest.fixture(scope="module")
def serving_python(tmp_path_factory) -> str:
    """A serving image's python3 as far as we know it: nothing of ours installed."""
    folder = tmp_path_factory.mktemp("image")
    venv.create(folder / "venv", with_pip=False)
    return str(folder / "venv" / "bin" / "python")


@pytest.fixture(scope="module")
def absent(tmp_path_factory) -> Path:
    """Packages that fail to import, ahead of the torch stack's site-packages (which holds them too)."""
    root = tmp_path_factory.mktemp("absent")
    for name in ABSENT:
        (root / name).mkdir()
        (root / name / "__init__.py").write_text(f"raise ImportError('{name}: not in a serving image')\n")
    return root


def test_the_copied_tree_proves_a_pass_in_a_foreign_interpreter(installed_copy, serving_python, absent, tmp_path):
    """The run container's command in a bare interpreter: PYTHONPATH is the copy, then the image's stack
    (the fake aiter; the real torch and Triton from our venv's site-packages, without its .pth files, so
    the checkout's gluon_agent is not importable: only the copy is)."""
    stack = [str(AITER_STACK), sysconfig.get_paths()["purelib"]]
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "PYTHONPATH": os.pathsep.join([str(installed_copy / "lib"), str(absent), *stack]),
    }
    log = tmp_path / "termination-log"
    argv = [serving_python, "-m", contract.SELFTEST_POD_MODULE, "--serving-config", '{"verifyQLens": [3]}']
    argv += ["--deadline", "240", "--cpu-interpret", "--timeout", "200", "--termination-log", str(log)]
    done = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    message = log.read_text()
    assert len(message.encode()) <= report.PROOF_MESSAGE_LIMIT
    proof = PodProof.model_validate_json(message)
    assert proof.selftest.result == "pass", proof.selftest
    assert proof.selftest.trigger == selftest_pod.TRIGGER and proof.selftest.mode == "cpu-interpret"
    assert proof.selftest.serving.digest == ServingConfig(verify_q_lens=(3,)).digest
    assert [g.result for g in proof.selftest.gpus] == [{"accelerated": "pass", "fallback": "pass"}]
    assert proof.probe.capable is False and "GPU arch gfx950 (no GPU visible)" in proof.probe.missing_for_capable
    full = json.loads(done.stdout)  # the pod's log: the whole report, the copy's modules did the work
    assert full["selftest"]["fingerprint"] == proof.selftest.fingerprint
    assert full["probe"]["python"] == serving_python and full["probe"]["import_ok"] is True  # the fake aiter


# ---------------------------------------------------------------- the message within its bound


def runner_report(gpus: int, reason_length: int, reasons: int = 8) -> dict:
    """A runner report of `gpus` GPUs whose paths fail with `reasons` long reasons each."""
    outcome = simulated_selftest(range(gpus), accelerated="fail", fallback="error", speedup=float("nan"))
    for gpu in outcome["gpus"]:
        for path, info in gpu["paths"].items():
            info["reasons"] = [
                f"{path} reason {i} on GPU {gpu['index']}: " + "x" * reason_length for i in range(reasons)
            ]
    return outcome | {
        "fingerprint": "0123456789abcdef",
        "mode": "gpu",
        "problems": ["a long problem: " + "p" * reason_length],
        "thresholds": {"rel_l2_max": 0.02, "note": "t" * reason_length},
        "serving": DEFAULT_SERVING.as_dict() | {"digest": DEFAULT_SERVING.digest},
        "routes": {"accelerated": {"no_route": ["q_len 4: " + "r" * reason_length]}},
        "seconds": 12.5,
        "finished_at": 1.7e9,
    }


def probe_report(missing_length: int = 0) -> dict:
    probed = simulated_node(capable=False)["probe"]
    probed["sglang"]["evidence"] = "e" * max(missing_length, 10)
    probed["missing_for_capable"] = [f"missing {i}: " + "m" * missing_length for i in range(6)]
    probed["import_crash"] = "crash: " + "c" * missing_length
    return probed


def message_of(probed: dict | None, runner: dict) -> tuple[str, PodProof]:
    text = selftest_pod.proof_message(selftest_pod.make_proof(probed, runner))
    assert len(text.encode()) <= report.PROOF_MESSAGE_LIMIT
    return text, PodProof.model_validate_json(text)


def test_a_small_proof_is_whole():
    probed, runner = simulated_node()["probe"], simulated_selftest(range(2))
    text, proof = message_of(probed, runner)
    assert not proof.truncated
    assert proof.selftest == SelfTest.model_validate(selftest_pod.selftest_summary(runner, selftest_pod.TRIGGER))
    assert proof.probe == Probe.model_validate(selftest_pod.probe_summary(probed))
    assert proof.selftest.gpus[0].speedup == {"long-b1-128k": 2.3, "long-b32-64k": 2.3}


def test_eight_gpus_with_long_reasons_fit_keeping_the_verdict():
    runner = runner_report(8, 2000)
    text, proof = message_of(probe_report(400), runner)
    assert proof.truncated and len(text) > 3000  # cut to fit, not to nothing
    test = proof.selftest
    assert test.result == "error" and test.fingerprint == "0123456789abcdef"
    assert test.serving.digest == DEFAULT_SERVING.digest
    assert [(g.index, g.result) for g in test.gpus] == [
        (i, {"accelerated": "fail", "fallback": "error"}) for i in range(8)
    ]
    assert test.problems and test.problems[0].startswith("a long problem: ppp")
    assert proof.probe.capable is False and len(proof.probe.missing_for_capable) >= 4
    assert proof.probe.missing_for_capable[0].startswith("missing 0: mmm")
    assert proof.probe.import_crash.startswith("crash: ccc")
    assert not test.thresholds and all(not g.speedup for g in test.gpus)  # details went first


def test_moderate_reasons_keep_the_first_reason_of_each_gpu_and_path():
    text, proof = message_of(probe_report(50), runner_report(8, 120))
    assert proof.truncated
    for gpu in proof.selftest.gpus:
        assert [r.split(":")[0] for r in gpu.reasons["accelerated"]] == [f"accelerated reason 0 on GPU {gpu.index}"]
        assert gpu.reasons["fallback"][0].startswith(f"fallback reason 0 on GPU {gpu.index}: xxx")


@pytest.mark.parametrize("gpus, length", [(64, 500), (400, 10), (8, 200_000)])
def test_any_report_fits(gpus, length):
    """Past what the cuts can fit, the message is the verdict alone (the log has the rest)."""
    runner = runner_report(gpus, length)
    runner["problems"] = ["é" * min(length, 5000)] * 50  # escaped in JSON: six bytes a character
    _, proof = message_of(probe_report(length), runner)
    assert proof.truncated and proof.selftest.result == "error"
    assert proof.selftest.fingerprint == "0123456789abcdef"
    assert proof.selftest.serving.digest == DEFAULT_SERVING.digest
    assert proof.probe.missing_for_capable[0].startswith("missing 0") and proof.probe.import_crash.startswith("crash")
    shown = [(g.index, g.result) for g in proof.selftest.gpus]  # the first GPUs, as many as fit
    assert len(shown) >= min(gpus, 8) and shown == [
        (i, {"accelerated": "fail", "fallback": "error"}) for i in range(len(shown))
    ]


def test_non_finite_numbers_are_null_not_invalid_json():
    runner = simulated_selftest(range(1))
    runner["gpus"][0]["speedup"] = {"long-b1-128k": float("inf"), "long-b32-64k": float("nan")}
    _, proof = message_of(None, runner)
    assert proof.selftest.gpus[0].speedup == {"long-b1-128k": None, "long-b32-64k": None}


# ---------------------------------------------------------------- the agent's Node report: the same cut as before


def selftest_summary_before(report, trigger, fingerprint=None):
    """daemon.selftest_summary as it was before the cut moved to selftest_pod (kept to compare)."""
    gpus = []
    for gpu in report.get("gpus", []):
        paths = gpu.get("paths", {})
        max_error = {}
        for path, info in paths.items():
            errors = [c["rel_l2"] for c in (info.get("child") or {}).get("cases", []) if c.get("rel_l2") is not None]
            max_error[path] = max(errors) if errors else None
        gpus.append(
            GpuResult(
                index=gpu.get("index"),
                result=gpu.get("result", {}),
                speedup=gpu.get("speedup", {}),
                max_rel_l2=max_error,
                reasons={p: i.get("reasons", [])[:5] for p, i in paths.items() if i.get("reasons")},
            )
        )
    return SelfTest(
        result=report.get("result"),
        fingerprint=fingerprint or report.get("fingerprint"),
        tested_at=report.get("finished_at"),
        seconds=report.get("seconds"),
        trigger=trigger,
        mode=report.get("mode"),
        backend_set=report.get("backend_set"),
        thresholds=report.get("thresholds"),
        problems=report.get("problems", []),
        simulated=bool(report.get("simulated")),
        serving=report.get("serving"),
        no_route={
            path: info.get("no_route") for path, info in (report.get("routes") or {}).items() if info.get("no_route")
        },
        gpus=gpus,
    )


@pytest.mark.parametrize(
    "sample",
    [runner_report(8, 50), simulated_selftest(range(3)), {"result": "error", "problems": ["boom"], "gpus": []}],
)
@pytest.mark.parametrize("fp", [None, "published-fp"])
def test_the_daemon_summary_is_unchanged(sample, fp):
    assert daemon.selftest_summary(sample, "start", fp) == selftest_summary_before(sample, "start", fp)


def test_the_daemon_node_report_probe_is_unchanged():
    probed = probe_report(20) | {"simulated": 1}
    published = daemon.node_report("n1", probed, "fp", None, "pending", None)
    assert published.probe == Probe(
        capable=False,
        ready=probed["ready"],
        missing_for_capable=probed["missing_for_capable"],
        summary=probed["summary"],
        import_crash=probed["import_crash"],
        sglang=probed["sglang"],
        simulated=True,
    )


# ---------------------------------------------------------------- failures are error verdicts


SOURCES = """
import os, time
from gluon_agent import isolation

class Crashing:
    name = "crashing"
    def __init__(self, where="probe"):
        self.where = where
    def probe(self):
        if self.where == "probe":
            raise RuntimeError("the probe exploded")
        return {"capable": True, "missing_for_capable": [], "gpus": [{"index": 0, "arch": "gfx950"}]}
    def selftest(self, probe_report, serving):
        raise RuntimeError("the self-test exploded")

class Hanging:
    name = "hanging"
    def __init__(self, pid_file):
        self.pid_file = pid_file
    def probe(self):
        return {"capable": True, "missing_for_capable": [], "gpus": []}
    def selftest(self, probe_report, serving):
        script = f"echo $$ > {self.pid_file}.tmp && mv {self.pid_file}.tmp {self.pid_file}; exec sleep 3600"
        argv = ["/bin/sh", "-c", script]
        isolation.run_isolated(argv, timeout=3600)
        return {"result": "pass", "gpus": []}
"""


@pytest.fixture
def sources(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "sources"
    folder.mkdir()
    (folder / "pod_sources.py").write_text(textwrap.dedent(SOURCES))
    monkeypatch.syspath_prepend(str(folder))
    return folder


def run_in_process(tmp_path, *args) -> tuple[int, PodProof]:
    log = tmp_path / "termination-log"
    code = selftest_pod.main([*args, "--termination-log", str(log)])
    text = log.read_text()
    assert len(text.encode()) <= report.PROOF_MESSAGE_LIMIT
    return code, PodProof.model_validate_json(text)


def test_a_crashing_probe_is_an_error_with_its_reason(sources, tmp_path):
    code, proof = run_in_process(tmp_path, "--source", "pod_sources:Crashing")
    assert code == 0 and proof.selftest.result == "error"
    assert proof.selftest.problems == ["the probe failed: RuntimeError: the probe exploded"]
    assert proof.selftest.serving.digest == DEFAULT_SERVING.digest and proof.selftest.fingerprint is None


def test_a_crashing_selftest_is_an_error_keeping_the_probe(sources, tmp_path):
    code, proof = run_in_process(tmp_path, "--source=pod_sources:Crashing", "--source-arg=selftest")
    assert code == 0 and proof.selftest.result == "error"
    assert proof.selftest.problems == ["the self-test failed: RuntimeError: the self-test exploded"]
    assert proof.probe.capable is True
    assert proof.selftest.fingerprint == fingerprint({"capable": True, "gpus": [{"index": 0, "arch": "gfx950"}]})


@pytest.mark.parametrize(
    "args, why",
    [
        (["--serving-config", '{"verifyQLens": [99]}'], "the serving config failed: ValueError: --serving-config."),
        (["--serving-config", ""], "the serving config failed: JSONDecodeError"),
        (["--source", "no_such_module_here:Source"], "the source failed: ValueError: --source"),
        (["--source-arg", "x"], "the argument check failed: ValueError: --source-arg without --source"),
        (["--timeout", "soon"], "usage: gluon-agent selftest-pod: argument --timeout"),
    ],
)
def test_bad_arguments_are_an_error_verdict(tmp_path, args, why):
    code, proof = run_in_process(tmp_path, *args)
    assert code == 0 and proof.selftest.result == "error"
    assert proof.selftest.problems[0].startswith(why), proof.selftest.problems


def test_no_gpu_is_an_error(tmp_path, monkeypatch):
    """The real probe and runner here, without --cpu-interpret: no GPU, nothing tested, an error."""
    for variable in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "PYTHONPATH"):
        monkeypatch.delenv(variable, raising=False)
    code, proof = run_in_process(tmp_path, "--probe-timeout", "60")
    assert code == 0 and proof.selftest.result == "error"
    assert proof.selftest.problems == ["no GPU visible: nothing to test"]
    assert proof.probe.capable is False and proof.selftest.fingerprint


def test_an_unwritable_termination_log_is_a_failed_exit(sources, tmp_path):
    missing = tmp_path / "no" / "such" / "folder" / "log"
    assert selftest_pod.main(["--source", "pod_sources:Crashing", "--termination-log", str(missing)]) == 1


def start_hanging(sources: Path, tmp_path: Path, *args: str) -> tuple[subprocess.Popen, Path, int]:
    """A pod process whose self-test hangs in a child of its own; returns it once the child runs."""
    log, pid_file = tmp_path / "termination-log", tmp_path / "child.pid"
    env = dict(os.environ, PYTHONPATH=str(sources))
    argv = [sys.executable, "-m", contract.SELFTEST_POD_MODULE, "--source", "pod_sources:Hanging"]
    argv += ["--source-arg", str(pid_file), "--termination-log", str(log), *args]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not pid_file.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    return proc, log, int(pid_file.read_text())


def gone(pid: int, within: float = 10.0) -> bool:
    """The process ended (reaped, or a zombie whose parent is gone)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except (FileNotFoundError, ProcessLookupError):
            return True
        time.sleep(0.05)
    return False


def test_the_deadline_writes_an_error_and_kills_the_children(sources, tmp_path):
    started = time.monotonic()
    proc, log, child = start_hanging(sources, tmp_path, "--deadline", "3")
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert time.monotonic() - started < 20
    proof = PodProof.model_validate_json(log.read_text())
    assert proof.selftest.result == "error" and proof.probe.capable is True
    assert proof.selftest.problems == ["deadline passed: no verdict within 3 s"]
    assert json.loads(out)["proof"] == json.loads(log.read_text())
    assert gone(child), "the hanging self-test child outlived the deadline"


def test_sigterm_writes_an_error_and_kills_the_children(sources, tmp_path):
    proc, log, child = start_hanging(sources, tmp_path)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    proof = PodProof.model_validate_json(log.read_text())
    assert proof.selftest.result == "error"
    assert proof.selftest.problems == ["terminated (SIGTERM) before a verdict"]
    assert gone(child)
