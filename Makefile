# The habits a newcomer finds first. Every target installs what it needs.
.PHONY: images record-gpu-images kind-e2e soak demo demo-tf test test-unit test-integration lint lint-checks format bootstrap cluster-up cluster-down crd bench bench-full bench-quick bench-realpods bench-realpods-kind


demo:  ## a real HorovodJob from kubectl apply to Succeeded (PyTorch; see hack/demo.sh --help)
	hack/demo.sh

demo-tf:  ## the same with the TensorFlow example
	hack/demo.sh --tensorflow

bootstrap:  ## install system packages, .venv, control plane binaries, worker frameworks
	hack/bootstrap.sh

test: bootstrap  ## every test: unit, integration (real control plane), training, e2e, images; builds beside them what later tests need (hack/test.sh)
	hack/test.sh

test-unit: ## pure tests, no cluster (tests mirror the code: tests/operator, tests/worker, tests/tooling)
	SKIP_WORKER=1 hack/bootstrap.sh
	.venv/bin/pytest -ra -m "not integration and not e2e and not training and not images"

test-integration:  ## against the local control plane (tests/*/integration)
	SKIP_WORKER=1 hack/bootstrap.sh
	.venv/bin/pytest -ra -m integration

images:  ## the operator image and the four worker images (docs/images.md); starts a Docker engine if none answers (hack/images.sh --help)
	hack/images.sh engine
	hack/images.sh operator
	hack/images.sh worker

record-gpu-images:  ## build the two GPU worker images, run their tests, record the answers for machines that do not build them (localcluster/image_record.py)
	HVK_GPU_IMAGES=record .venv/bin/pytest -p no:cacheprovider -ra tests/worker/images
	.venv/bin/python -m localcluster.image_record check

kind-e2e:  ## tests/e2e/kind/run.sh on kind with a node image built here (no registry; docs/dev/kind-node-image.md)
	SKIP_WORKER=1 hack/bootstrap.sh
	hack/images.sh engine
	hack/kind.sh node-image
	mkdir -p .work && hack/kind.sh config > .work/kind-config.yaml
	PATH="$(CURDIR)/.venv/bin:$$(hack/kind.sh path):$$PATH" KIND_NODE_IMAGE="$$(hack/kind.sh image-name)" \
	  KIND_CONFIG=.work/kind-config.yaml tests/e2e/kind/run.sh

lint:  ## ruff and mypy (strict: the operator, the contract, the tooling, the tests and bench)
	SKIP_WORKER=1 hack/bootstrap.sh
	$(MAKE) --no-print-directory lint-checks

# No install step: .ci/run runs it beside the tests, which import from the same .venv
# (a second bootstrap would reinstall the operator under them).
lint-checks:  ## the lint alone, on an installed .venv
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy operator/horovod_operator contract/horovod_contract localcluster
	.venv/bin/mypy worker/horovod_worker
	.venv/bin/mypy tests bench

format:
	.venv/bin/ruff format .
	.venv/bin/ruff check --fix .

cluster-up:
	hack/cluster.sh up

cluster-down:
	hack/cluster.sh down

crd:  ## regenerate crds/, the chart's CRD and docs/api.md from the models
	.venv/bin/python -m horovod_operator.crd

bench:  ## the short benchmark: 8 and 64 workers, a 30-job burst, idle with 1,000 jobs (~15 min); .work/bench
	SKIP_WORKER=1 hack/bootstrap.sh
	.venv/bin/python -m bench --sizes 8,64 --repeats 3 --burst-jobs 30 --out .work/bench

bench-full:  ## the run docs/benchmarks is made from: 8, 64 and 512 workers, a 100-job burst, every peer (~45 min); docs/benchmarks
	SKIP_WORKER=1 hack/bootstrap.sh
	.venv/bin/python -m bench

bench-realpods:  ## apply -> first step -> Succeeded with real pods, ours and mpi-operator on the node agent (root; 3 runs each, ~10 min); docs/benchmarks/realpods.json
	hack/bootstrap.sh
	HVK_REALPODS_REPEATS=3 HVK_REALPODS_OUT=docs/benchmarks/realpods.json \
	  .venv/bin/pytest -s tests/e2e/test_realpods.py

bench-realpods-kind:  ## the same on kind's real kubelet: run.sh, then ours and mpi-operator 3 runs each (~25 min warm); docs/benchmarks/realpods-kind.json
	REALPODS_REPEATS=3 REALPODS_OUT=$(CURDIR)/docs/benchmarks/realpods-kind.json $(MAKE) kind-e2e

soak:  ## chaos soak: 10 minutes of jobs and seeded faults, invariants checked (docs/soak)
	SKIP_WORKER=1 hack/bootstrap.sh
	.venv/bin/python -m bench.soak --out docs/soak

bench-quick:  ## one small case of each kind; asserts nothing about speed
	SKIP_WORKER=1 hack/bootstrap.sh
	.venv/bin/python -m bench --quick
