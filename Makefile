# `make test` and `make demo` set everything up on a fresh machine, then run. Both are idempotent.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
TOOLS := .tools/bin
TOOLS_STAMP := .tools/.installed-stamp
CLUSTER_BIN := .cluster/bin
PYTEST_ARGS ?=
RETRY := .ci/retry

.PHONY: test demo setup tools cluster images bench-probe clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(RETRY) $(PY) -m pip install -q --upgrade pip
	# torch first, pinned. On Linux x86_64 PyPI serves only its CUDA build, which brings about 3 GB of
	# nvidia-* wheels (it still runs on a CPU-only machine); a download cut short is resumed, then retried.
	$(RETRY) $(PY) -m pip install -q --resume-retries 10 torch==2.13.0
	$(RETRY) $(PY) -m pip install -q --resume-retries 10 -e '.[test,demo]'
	touch $(STAMP)

$(TOOLS_STAMP): .ci/install-tools
	.ci/install-tools
	touch $(TOOLS_STAMP)

setup: $(STAMP)
tools: $(TOOLS_STAMP)
# The test control plane (etcd, kube-apiserver, controller-manager, scheduler, kubectl, kwok) from the pins in
# localcluster/k8s; build.sh is a no-op while its stamp matches the pins (cold: minutes, see docs/developing/controlplane.md).
# Then the real nodes' kubelet (localcluster/node/build.sh: its own module and stamp, into .cluster/node-bin).
cluster:
	localcluster/k8s/build.sh
	localcluster/node/build.sh
	# the Prometheus Operator and its CRDs, from its own pins (localcluster/promop), into .cluster
	localcluster/promop/build.sh

# The images the real nodes run (buildah, bases from Debian's packages), each cached under a hash of its inputs.
images: setup tools
	PYTHONPATH="$(CURDIR)/localcluster" $(PY) -m gluon_localcluster.images

test: setup tools cluster images
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	PATH="$(CURDIR)/$(TOOLS):$$PATH" $(PY) -m pytest $(PYTEST_ARGS)

demo: setup tools cluster
	@echo "== gluon-agent probe on this machine (localcluster/gluon_localcluster/probe_step.py) =="
	@# 'not capable' (no AMD GPU here) is an answer, exit 0; only a probe that crashed stops the demo
	PYTHONPATH="$(CURDIR)/localcluster" $(PY) -m gluon_localcluster.probe_step
	@echo "== the whole rollout on a real control plane on 127.0.0.1 (localcluster/gluon_localcluster/demo.py) =="
	PATH="$(CURDIR)/$(TOOLS):$$PATH" PYTHONPATH="$(CURDIR)/localcluster" $(PY) -m gluon_localcluster.demo --out out/demo

bench-probe: setup
	$(PY) bench/probe.py --json

clean:
	rm -rf $(VENV) .tools .cluster .pytest_cache
