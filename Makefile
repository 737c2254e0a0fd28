# limen: the README's two commands are `make demo` and `make test`; both do all set-up from nothing.
SHELL := /bin/bash
PY ?= .venv/bin/python
PIP ?= .venv/bin/pip
STAMP := .venv/.installed
export OMP_WAIT_POLICY ?= PASSIVE
export PIP_DISABLE_PIP_VERSION_CHECK := 1
# The real data, where this machine has it (tests skip with a reason when it is absent).
SHARED_DATA := $(abspath ../shared/data)
export ALFWORLD_DATA ?= $(if $(wildcard $(SHARED_DATA)/alfworld/json_2.1.1),$(SHARED_DATA)/alfworld)
export WEBSHOP_DATA ?= $(if $(wildcard $(SHARED_DATA)/webshop/items_shuffle_1000.json),$(SHARED_DATA)/webshop)

.PHONY: install proto test test-slow demo bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3.11 -m venv .venv || python3 -m venv .venv
	$(PIP) install -q --upgrade pip setuptools wheel
	# torch 2.13.0 CPU first: an unpinned torch would pull a multi-GB CUDA build.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[alfworld,webshop,train,data,dev]'
	# alfworld and its engine without their declared extras (spaCy, 126 MB, is not used by the text game).
	$(PIP) install -q --no-deps alfworld==0.4.2 textworld==1.7.0 fast-downward-textworld==20.6.4 jericho==3.3.1
	touch $(STAMP)

proto: $(STAMP)
	$(PY) -m grpc_tools.protoc -Iproto --python_out=proto --grpc_python_out=proto --pyi_out=proto proto/limen/env/v1/env.proto

test: $(STAMP)
	$(PY) -m pytest -q -m "not slow and not gpu and not docker"

test-slow: $(STAMP)
	$(PY) -m pytest -q -m "slow and not gpu and not docker"

clean:
	rm -rf .venv .pytest_cache build *.egg-info
