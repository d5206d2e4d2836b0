"""`gluon-agent`: the node agent's command line. Exit codes: 0 success/capable, 1 not, 2 usage."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from gluon_common.sglang_routes import ServingConfig

from . import __version__, selftest_pod
from .probe import DEFAULT_TIMEOUT_S, format_table, probe
from .selftest import runner

if TYPE_CHECKING:
    from . import delivery


def positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def q_lens(text: str) -> tuple[int, ...]:
    try:
        return runner.cases.parse_q_lens(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def serving_config(text: str) -> ServingConfig:
    """--serving-config: the JSON object (or @FILE holding it) the operator writes on the node."""
    try:
        return selftest_pod.read_serving_config(text)
    except (OSError, ValueError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def cmd_probe(args: argparse.Namespace) -> int:
    report = probe(python=args.python, timeout=args.timeout)
    print(json.dumps(report, indent=2, sort_keys=True) if args.json else format_table(report))
    return 0 if report["capable"] else 1


def cmd_selftest(args: argparse.Namespace) -> int:
    result = runner.run_selftest(
        probe,  # run by the runner, while the self-test children import torch
        backend_set=args.backends,
        cpu_interpret=args.cpu_interpret,
        timeout=args.timeout,
        timing=not args.no_timing,
        mtp_q_lens=args.mtp_q_lens,
        serving=args.serving_config,
    )
    print(json.dumps(result, indent=2, sort_keys=True) if args.json else runner.format_table(result))
    return 0 if result["result"] == "pass" else 1


def observation(args: argparse.Namespace) -> "delivery.Observation":
    """Where `run` reads its node's delivery observation: the observer container's file, or /proc itself."""
    from . import delivery

    if args.delivery_file:
        return delivery.FileObservation(Path(args.delivery_file), args.observe_interval)
    if args.observe_proc:
        root = delivery.resolve_root(args.observe_cgroup_root, lambda: Path("/proc/self/cgroup").read_text())
        return delivery.InlineObservation(Path(args.observe_proc), root, args.observe_interval)
    return delivery.NoObservation()


def cmd_observe(args: argparse.Namespace) -> int:
    import signal
    import threading

    from . import delivery

    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    root = delivery.resolve_root(args.cgroup_root, lambda: Path("/proc/self/cgroup").read_text())
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    delivery.run_observer(Path(args.proc), out, args.interval, root, stop)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from gluon_common.kube import NodeApi, make_api_client

    from .daemon import Agent, AgentConfig, install_signal_handlers
    from .sources import RealSource, named_source

    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if not args.node_name:
        print(
            "gluon-agent run: no node name: set NODE_NAME (downward API spec.nodeName) or --node-name", file=sys.stderr
        )
        return 2
    if args.source_arg is not None and not args.source:
        print("gluon-agent run: --source-arg without --source", file=sys.stderr)
        return 2
    try:
        source = (
            named_source(args.source, args.source_arg)
            if args.source
            else RealSource(args.cpu_interpret, args.selftest_timeout)
        )
    except ValueError as exc:
        print(f"gluon-agent run: {exc}", file=sys.stderr)
        return 2
    config = AgentConfig(
        node_name=args.node_name,
        host=args.host,
        port=args.port,
        period=args.period,
        jitter=args.jitter,
        probe_interval=args.probe_interval,
        retry_base=args.retry_base,
        max_view_age=args.max_view_age,
        watch_timeout=args.watch_timeout,
        tick=args.tick,
        observe_interval=args.observe_interval,
        image_proofs=args.image_proofs,
    )
    api = NodeApi(make_api_client(args.api_url, args.kubeconfig), args.node_name)
    agent = Agent(config, api, source, observation=observation(args))
    install_signal_handlers(agent)
    agent.run()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gluon-agent", description=__doc__)
    parser.add_argument("--version", action="version", version=f"gluon-agent {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("probe", help="capability probe of the aiter MLA Gluon decode path")
    p.add_argument("--python", help="interpreter to probe (default: this one)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--timeout", type=positive_float, default=DEFAULT_TIMEOUT_S, help="seconds per check child")
    p.set_defaults(func=cmd_probe)

    s = sub.add_parser(
        "selftest", help="on-GPU correctness, graph and speed test of the accelerated and fallback paths"
    )
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.add_argument(
        "--backends",
        choices=("auto", "aiter", "triton"),
        default="auto",
        help="auto: aiter on a capable gfx950 stack, else the portable Triton kernel",
    )
    s.add_argument(
        "--cpu-interpret",
        action="store_true",
        help="run the portable kernel under TRITON_INTERPRET=1 on tiny CPU shapes (no GPU needed)",
    )
    s.add_argument("--no-timing", action="store_true", help="skip the timing and copy-ceiling steps")
    s.add_argument("--timeout", type=positive_float, default=runner.DEFAULT_TIMEOUT_S, help="seconds per child")
    s.add_argument(
        "--mtp-q-lens",
        type=q_lens,
        default=runner.cases.MTP_Q_LENS,
        metavar="N,N,...",
        help="q lengths of the speculative-decoding (MTP) cases, e.g. 2,3,4 (default); '' for none",
    )
    s.add_argument(
        "--serving-config",
        type=serving_config,
        metavar="JSON|@FILE",
        help='the serving pods\' setup the routes follow, e.g. {"verifyQLens": [8]} (DSpark block 7), '
        '{"dcpSize": 2}; overrides --mtp-q-lens',
    )
    s.set_defaults(func=cmd_selftest)

    r = sub.add_parser("run", help="the node daemon: probe, self-test, publish labels and report, serve metrics")
    r.add_argument("--node-name", default=os.environ.get("NODE_NAME"), help="this node (default: $NODE_NAME)")
    r.add_argument("--api-url", help="Kubernetes API URL without auth (tests, development)")
    r.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster service account)")
    r.add_argument("--host", default="0.0.0.0")
    r.add_argument("--port", type=int, default=9477)
    r.add_argument("--period", type=positive_float, default=24 * 3600.0, help="seconds between periodic self-tests")
    r.add_argument("--jitter", type=float, default=0.1, help="fraction of the period to jitter by")
    r.add_argument("--probe-interval", type=positive_float, default=600.0, help="seconds between fingerprint probes")
    r.add_argument("--retry-base", type=positive_float, default=60.0, help="first back-off after a deferral")
    r.add_argument("--max-view-age", type=positive_float, default=90.0, help="decision answers '0' past this")
    r.add_argument("--watch-timeout", type=int, default=30)
    r.add_argument("--tick", type=positive_float, default=1.0)
    r.add_argument("--selftest-timeout", type=positive_float, default=runner.DEFAULT_TIMEOUT_S)
    r.add_argument("--cpu-interpret", action="store_true", help="self-test the portable kernel on the CPU")
    r.add_argument(
        "--source",
        metavar="MODULE:FACTORY",
        help="take probe and self-test results from FACTORY(--source-arg) instead of this node's GPUs "
        "(the local-cluster harness's SIMULATION: gluon_localcluster.fakes.simulated:SimulatedSource)",
    )
    r.add_argument("--source-arg", metavar="TEXT", help="the argument --source's factory is called with")
    r.add_argument(
        "--delivery-file",
        metavar="PATH",
        help="read the flag each serving process runs from the report `gluon-agent observe` writes there",
    )
    r.add_argument(
        "--observe-proc",
        metavar="PATH",
        help="read it from this /proc directly (needs CAP_SYS_PTRACE; the chart uses --delivery-file)",
    )
    r.add_argument("--observe-cgroup-root", default="auto", help="with --observe-proc: auto | any | a cgroup path")
    r.add_argument("--observe-interval", type=positive_float, default=5.0, help="seconds between observations")
    r.add_argument(
        "--image-proofs",
        action="store_true",
        help="answer '1' only for a pod whose own image digest this node proved (chart selfTest.inServingImage)",
    )
    r.add_argument("--log-level", default="INFO")
    r.set_defaults(func=cmd_run)

    o = sub.add_parser(
        "observe",
        help="the observer: write the flag each injected serving process on this node runs (needs CAP_SYS_PTRACE)",
    )
    o.add_argument("--proc", default="/proc", help="the host's /proc (the chart mounts it at /host/proc)")
    o.add_argument("--out", required=True, help="where to write the report (the agent's --delivery-file)")
    o.add_argument("--interval", type=positive_float, default=5.0)
    o.add_argument(
        "--cgroup-root",
        default="auto",
        help="only pods under this kubelet cgroup root: auto (read off this process's own cgroup), any, or a path",
    )
    o.add_argument("--log-level", default="INFO")
    o.set_defaults(func=cmd_observe)

    # Listed for --help; main() hands `preflight ...` to preflight.main (its own options).
    sub.add_parser(
        "preflight", add_help=False, help="serving pod init step: decide the flag (gluon-agent preflight --help)"
    )
    # Likewise `selftest-pod ...` goes to selftest_pod.main.
    sub.add_parser(
        "selftest-pod",
        add_help=False,
        help="self-test pod steps: --install DIR (agent image), then the self-test in the serving image "
        "(gluon-agent selftest-pod --help)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["preflight"]:  # its own parser: argparse's REMAINDER does not pass on `--install ...`
        from . import preflight

        return preflight.main(argv[1:])
    if argv[:1] == ["selftest-pod"]:
        return selftest_pod.main(argv[1:])
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
