"""Every output a command writes whole goes through `ownership.replacing` (folders) or
`files.atomic_write` (files): a link given as the output (`-o models/current`) is followed, its
target written and the link kept; and a folder another command is writing now is refused in one line.
The export's own `-o` is driven through its console script's `main`, refused before the model loads."""

from __future__ import annotations

import os

import pytest

from dfine_deploy.data.synthetic import SPLIT
from dfine_deploy.data.yolo import CONVERTED
from dfine_deploy.export.cli import main as export_main
from dfine_deploy.export.pipeline import ARTIFACT
from dfine_deploy.export.triton import MODEL_FOLDER
from dfine_deploy.files import atomic_write_bytes
from dfine_deploy.ownership import replacing

# each folder writer's claim (dfine-export -o, dfine-data synth/convert-yolo --out, dfine-export --triton)
# and a marker file of it
WRITERS = {
    "artifact": (ARTIFACT, "model.json"),
    "synth": (SPLIT, "annotations.json"),
    "convert-yolo": (CONVERTED, "annotations.json"),
    "triton": (MODEL_FOLDER, "config.pbtxt"),
}


@pytest.mark.parametrize("dangling", [False, True], ids=["to-a-folder", "to-a-new-folder"])
@pytest.mark.parametrize("writer", WRITERS)
def test_a_linked_output_folder_is_followed_and_the_link_kept(tmp_path, writer, dangling):
    claim, marker = WRITERS[writer]
    real = tmp_path / "models" / "v2"
    if not dangling:
        real.mkdir(parents=True)
    link = tmp_path / "current"
    link.symlink_to(real, target_is_directory=True)
    with replacing(link, claim, option="-o") as staging:
        (staging / marker).write_text("{}")
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert sorted(p.name for p in real.iterdir()) == [marker]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["current", "models"]  # nothing left beside


def test_a_linked_output_file_is_followed_and_the_link_kept(tmp_path):
    """dfine-bench --json/--plot, dfine-serve --output-json and every other file written whole."""
    real = tmp_path / "reports" / "bench.json"
    real.parent.mkdir()
    real.write_text("old")
    link = tmp_path / "bench.json"
    link.symlink_to(real)
    atomic_write_bytes(link, b"new")
    assert link.is_symlink() and real.read_text() == "new"


def test_a_second_export_into_a_folder_being_written_is_refused_in_one_line(tmp_path, capsys):
    """Two exports started into the same new -o both staged it, both printed "wrote", and the second
    swapped its artifact over the first unasked; now the second is refused while the first writes."""
    out = tmp_path / "new"
    with replacing(out, ARTIFACT, option="-o") as staging:  # the first export, still writing
        code = export_main(["dfine-n", "--imgsz", "320", "320", "-o", str(out)])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1, err
        assert f"-o {out}: another process (pid {os.getpid()}) is writing this folder now" in err
        (staging / "model.json").write_text("{}")
    assert sorted(p.name for p in out.iterdir()) == ["model.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new"]  # the lock went with the writer


def test_a_training_output_dir_that_is_a_link_to_a_new_folder_is_followed(tmp_path):
    """`--output-dir runs/current` pointing at a folder not made yet: judged and locked as that folder
    (it was refused as "exists and is not a folder", and the lock could not be made)."""
    from dfine_deploy.ownership import claim_folder
    from dfine_deploy.training.runlock import LOCK_NAME, RunLock
    from dfine_deploy.training.runlog import TRAINING_RUN

    real = tmp_path / "runs" / "v2"
    link = tmp_path / "current"
    link.symlink_to(real, target_is_directory=True)
    assert claim_folder(link, TRAINING_RUN, option="--output-dir", replaces=False) is False
    lock = RunLock(link)
    lock.acquire(note=print)
    try:
        assert (real / LOCK_NAME).is_file() and link.is_symlink()
    finally:
        lock.release()
