"""Results for the site: the fixture loads, and bad files fail naming the file and the field."""

import json

import pytest
from conftest import FIXTURES

from site_gen import results_io


def test_fixture_loads_through_the_site_loader():
    data = results_io.load_all(FIXTURES / "results")
    assert list(data) == ["nvidia-h200"]
    assert data["nvidia-h200"]["results"]


def test_missing_folder_is_empty(tmp_path):
    assert results_io.load_all(tmp_path / "nope") == {}


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d.update(schema_version=7), "schema_version"),
    (lambda d: d["results"][0].update(causal="yes"), "results[0].causal"),
    (lambda d: d["results"][0].update(status="great"), "results[0].status"),
    (lambda d: d["results"][0].update(run_id="nope"), "results[0].run_id"),
])
def test_minimal_loader_names_file_and_field(tmp_path, mutate, field):
    data = json.loads((FIXTURES / "results" / "nvidia-h200.json").read_text())
    mutate(data)
    path = tmp_path / "nvidia-h200.json"
    path.write_text(json.dumps(data))
    with pytest.raises(results_io.ResultsError) as err:
        results_io.load_file(path)
    assert str(path) in str(err.value) and f"'{field}'" in str(err.value)


def test_ok_entry_needs_tflops(tmp_path):
    data = json.loads((FIXTURES / "results" / "nvidia-h200.json").read_text())
    ok = next(i for i, e in enumerate(data["results"]) if e["status"] == "ok")
    data["results"][ok]["tflops"] = None
    path = tmp_path / "x.json"
    path.write_text(json.dumps(data))
    with pytest.raises(results_io.ResultsError, match=rf"results\[{ok}\]\.tflops"):
        results_io.load_file(path)


def test_bad_json_is_named(tmp_path):
    path = tmp_path / "nvidia-h200.json"
    path.write_text("{")
    with pytest.raises(ValueError, match="nvidia-h200.json"):
        results_io.load_all(tmp_path)
