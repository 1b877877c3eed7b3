"""Pages show a run's command as a reader would run it: the options that only sent the run's files
to a folder outside the repository (the GPU machine's $OUT) are left out; everything else is as recorded."""

from __future__ import annotations

from site_gen.commands import reader_command


def test_options_pointing_outside_the_repository_are_left_out():
    cmd = ("python -m bench --what backward --backward-stages 6,7 --backward-peers fa4,cudnn,fa2 "
           "--out /root/out/w/c/nvidia-h200.json --raw /root/out/w/c/backward-raw.json")
    assert reader_command(cmd) == "python -m bench --what backward --backward-stages 6,7 --backward-peers fa4,cudnn,fa2"
    assert reader_command("python -m bench.models --training --out=/root/out/m.json") == \
        "python -m bench.models --training"


def test_everything_else_is_shown_as_recorded():
    for cmd in ("python -m bench --what forward --stages 24 --peers fa3,fa4,cudnn --shapes head-dims",
                "python -m bench --out bench/results/nvidia-h200.json",  # a repository path: kept
                "python -m bench --raw",  # an option without its value: as it was
                "python -m bench --label 'a b"):  # unbalanced quotes: as it was
        assert reader_command(cmd) == cmd


def test_the_pages_show_no_gpu_machine_paths():
    """The committed records hold commands with --out /root/out/... (the runs of 2026-12-02); the
    provenance lists the pages draw from them do not."""
    from conftest import REPO
    from hopattn.records import models as model_records
    from hopattn.records import results

    from site_gen.benchmark_section import tables
    from site_gen.models_page import _provenance

    record = model_records.load_all(REPO / "bench" / "results")["nvidia-h200"]
    assert "/root/out" not in _provenance(record)
    nums = next(f for f in results.load_indexed(REPO / "bench" / "results") if f.gpu == "nvidia-h200")
    assert "/root/out" not in tables.environment(nums)
