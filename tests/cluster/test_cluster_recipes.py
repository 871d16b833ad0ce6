"""The SLURM and Kubeflow recipes in train/cluster/, checked offline (no cluster here).

The batch script must parse (`bash -n`), and its dry run must give every node a torchrun line that
torchrun's own parser and train/main.py's parser accept. The PyTorchJob manifest must validate
against the vendored subset of the PyTorchJob CRD schema (train/cluster/pytorchjob.schema.json).
"""

from __future__ import annotations

import copy
import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CLUSTER = REPO / "train" / "cluster"
SBATCH = CLUSTER / "slurm.sbatch"


def _bash() -> str:
    bash = shutil.which("bash")
    assert bash, "bash is needed to check the SLURM recipe"
    return bash


def _dry_run(*args: str, nodes: str = "gpu-a gpu-b gpu-c") -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(
        DRY_RUN="1",
        DRY_RUN_NODES=nodes,
        CONFIG="configs/dfine/dfine_hgnetv2_n_coco.yml",
        OUTPUT_DIR="/shared/runs/n",
        GPUS_PER_NODE="4",
    )
    proc = subprocess.run(
        [_bash(), str(SBATCH), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def test_slurm_script_parses():
    proc = subprocess.run([_bash(), "-n", str(SBATCH)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr


def test_slurm_dry_run_gives_each_node_one_rendezvous_and_valid_arguments():
    from torch.distributed.run import get_args_parser as torchrun_parser

    from dfine_deploy.training.cli import get_args_parser as train_parser

    lines = _dry_run("--use-amp", "--seed", "3")
    assert [line.split(":", 1)[0] for line in lines] == ["gpu-a", "gpu-b", "gpu-c"]
    parsed = []
    for line in lines:
        argv = shlex.split(line.split(": ", 1)[1])
        assert argv[0] == "torchrun"
        run = torchrun_parser().parse_args(argv[1:])
        parsed.append(run)
        assert run.training_script == "train/main.py"
        assert (run.nnodes, run.nproc_per_node, run.rdzv_backend) == ("3", "4", "c10d")
        train = train_parser().parse_args(run.training_script_args)
        assert (
            train.config == str(Path("configs/dfine/dfine_hgnetv2_n_coco.yml").absolute())
            and train.output_dir == "/shared/runs/n"
        )
        assert train.use_amp is True and train.seed == 3
    # every node meets at the same place: the first node, one job id
    assert {(r.rdzv_endpoint, r.rdzv_id) for r in parsed} == {("gpu-a:29500", "12345")}


def test_slurm_script_outside_an_allocation_says_so():
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k != "DRY_RUN"}
    proc = subprocess.run(
        [_bash(), str(SBATCH)], cwd=REPO, env=env, capture_output=True, text=True, timeout=30
    )
    assert proc.returncode != 0 and "not inside a SLURM allocation" in proc.stderr


@pytest.fixture(scope="module")
def schema() -> dict:
    document = json.loads((CLUSTER / "pytorchjob.schema.json").read_text())
    assert "kubeflow/training-operator" in document["$comment"]  # the source is named
    return document


@pytest.fixture(scope="module")
def manifest() -> dict:
    return yaml.safe_load((CLUSTER / "pytorchjob.yaml").read_text())


def test_pytorchjob_manifest_matches_the_crd_schema(schema, manifest):
    jsonschema.Draft7Validator(schema).validate(manifest)
    replicas = manifest["spec"]["pytorchReplicaSpecs"]
    assert replicas["Master"]["replicas"] == 1
    for role in replicas.values():
        container = role["template"]["spec"]["containers"][0]
        assert container["name"] == "pytorch"  # the training operator's expected container name


def test_the_schema_catches_a_misspelt_or_mistyped_field(schema, manifest):
    validator = jsonschema.Draft7Validator(schema)
    misspelt = copy.deepcopy(manifest)
    misspelt["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["argz"] = []
    mistyped = copy.deepcopy(manifest)
    mistyped["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = "two"
    missing = copy.deepcopy(manifest)
    del missing["spec"]["pytorchReplicaSpecs"]
    for bad in (misspelt, mistyped, missing):
        assert list(validator.iter_errors(bad)), bad


def test_pytorchjob_runs_train_main_with_arguments_it_accepts(manifest):
    from dfine_deploy.training.cli import get_args_parser as train_parser

    for role in manifest["spec"]["pytorchReplicaSpecs"].values():
        container = role["template"]["spec"]["containers"][0]
        assert container["command"] == ["torchrun", "train/main.py"]
        args = train_parser().parse_args(container["args"])
        assert (REPO / args.config).is_file()
        assert args.output_dir.startswith(container["volumeMounts"][0]["mountPath"])  # on shared storage
