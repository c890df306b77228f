# The habits a newcomer finds first. Every target installs what it needs.
.PHONY: demo test test-unit test-integration lint format bootstrap cluster-up cluster-down crd clean

PY := .venv/bin/python

bootstrap:  ## install system packages, .venv, control plane binaries, worker frameworks
	hack/bootstrap.sh

test: bootstrap  ## every test: unit, integration (real control plane), training, e2e
	.venv/bin/pytest -ra

test-unit: ## pure tests, no cluster
	SKIP_WORKER=1 hack/bootstrap.sh
	.venv/bin/pytest -ra tests/unit

test-integration:
	SKIP_WORKER=1 hack/bootstrap.sh
	.venv/bin/pytest -ra tests/integration

lint:  ## ruff and mypy (strict for the operator)
	SKIP_WORKER=1 hack/bootstrap.sh
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy operator/horovod_operator
	.venv/bin/mypy worker/horovod_worker

format:
	.venv/bin/ruff format .
	.venv/bin/ruff check --fix .

cluster-up:
	hack/cluster.sh up

cluster-down:
	hack/cluster.sh down
