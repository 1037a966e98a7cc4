"""The packing reader takes every trace shape the FGD simulator's pod_csv_to_yaml.py takes.

Shapes are those of the simulator's data/csv/ files: the full openb columns, the five-column
multigpu files (no gpu_spec, qos, phase or times), and the other spellings its converter reads
(job_id instead of name, cpu in cores, no memory_mib, no gpu_milli). Malformed cells fail with
the file, the row and the column.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from allocator.experiments.fgd import main
from allocator.packing import GPU_MILLI, PodSpec, TraceFormatError, read_nodes_csv, read_pods_csv

TRACES = Path(__file__).resolve().parents[2] / "data" / "traces"
NODES_CSV = TRACES / "openb_node_list_gpu_node.csv"
PODS_CSV = TRACES / "openb_pod_list_default.csv"


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def _pods(path: Path) -> tuple[PodSpec, ...]:
    return read_pods_csv(path)[2]


# --- shapes the simulator reads ----------------------------------------------------------------


def test_five_column_multigpu_shape_reads_like_the_full_shape(tmp_path: Path) -> None:
    full = _write(
        tmp_path / "full.csv",
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
        "p0,12000,16384,1,1000,,LS,Running,0,12537496,0\n"
        "p1,6000,12288,1,460,,LS,Running,427061,12902960,427061\n"
        "p2,88000,327680,8,1000,,Burstable,Succeeded,9437497,10769854,9437497\n",
    )
    short = _write(
        tmp_path / "multigpu.csv",
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,12000,16384,1,1000\np1,6000,12288,1,460\np2,88000,327680,8,1000\n",
    )
    assert _pods(short) == _pods(full)
    assert _pods(short)[1] == PodSpec(name="p1", cpu_milli=6000, memory_mib=12288, num_gpu=1, gpu_milli=460)


def test_absent_gpu_milli_means_whole_gpus_and_absent_memory_means_none(tmp_path: Path) -> None:
    pods = _pods(_write(tmp_path / "p.csv", "name,cpu_milli,num_gpu\na,4000,2\nb,1000,0\n"))
    assert pods[0] == PodSpec(name="a", cpu_milli=4000, memory_mib=0, num_gpu=2, gpu_milli=GPU_MILLI)
    assert pods[1].num_gpu == 0
    assert pods[1].memory_mib == 0


def test_empty_gpu_milli_cell_is_a_share_of_zero_so_a_cpu_pod(tmp_path: Path) -> None:
    # pod_csv_to_yaml.py: a NaN gpu_milli fails 0 < x <= 1000 and x > 1000, so the pod asks for "0".
    pods = _pods(_write(tmp_path / "p.csv", "name,cpu_milli,num_gpu,gpu_milli\na,4000,1,\nb,4000,1,1500\n"))
    assert pods[0].num_gpu == 0
    assert pods[0].gpu_milli == 0
    assert pods[1].gpu_milli == GPU_MILLI  # clipped


def test_gpu_spec_absent_or_empty_allows_any_model_and_lists_are_split(tmp_path: Path) -> None:
    pods = _pods(
        _write(
            tmp_path / "p.csv",
            "name,cpu_milli,num_gpu,gpu_milli,gpu_spec\na,1,1,500,\nb,1,1,500,V100M32|V100M16\nc,1,1,500,|T4|\n",
        )
    )
    assert [p.gpu_spec for p in pods] == [(), ("V100M16", "V100M32"), ("T4",)]


def test_job_id_names_pods_as_the_simulator_does_and_cpu_in_cores(tmp_path: Path) -> None:
    path = _write(tmp_path / "p.csv", "job_id,cpu,num_gpu,gpu_milli\n7,1.5,1,300\n12,16,0,0\n")
    header, rows, pods = read_pods_csv(path)
    assert [p.name for p in pods] == ["job-0007", "job-0012"]
    assert [p.cpu_milli for p in pods] == [1500, 16000]
    assert header == ("name", "job_id", "cpu", "num_gpu", "gpu_milli")
    assert rows[0]["name"] == "job-0007"
    assert rows[0]["job_id"] == "7"


def test_ignored_columns_are_kept_for_the_arrived_file_but_not_checked(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "p.csv",
        "name,cpu_milli,num_gpu,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
        "a,1000,1,weird,Unknown,,,not-a-time\n",
    )
    _header, rows, pods = read_pods_csv(path)
    assert rows[0]["scheduled_time"] == "not-a-time"
    assert rows[0]["qos"] == "weird"
    assert pods[0].gpu_milli == GPU_MILLI


def test_node_list_with_cpu_only_nodes_and_an_empty_model(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "nodes.csv",
        "sn,cpu_milli,memory_mib,gpu,model\nopenb-node-0000,32000,262144,0,\nopenb-node-0001,96000,786432,8,G2\n",
    )
    nodes = read_nodes_csv(path)
    assert [(n.gpus, n.model) for n in nodes] == [(0, ""), (8, "G2")]


# --- what is truly malformed -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("name,cpu_milli,num_gpu\na,abc,1\n", r"p\.csv: row 2, column 'cpu_milli': must be a number, got 'abc'"),
        ("name,cpu_milli,num_gpu\na,1,1\nb,-5,1\n", r"p\.csv: row 3, column 'cpu_milli': must be >= 0, got '-5'"),
        ("name,cpu_milli,num_gpu\na,1.5,1\n", r"row 2, column 'cpu_milli': must be a whole number, got '1.5'"),
        ("name,cpu_milli,num_gpu\na,,1\n", r"row 2, column 'cpu_milli': empty, expected a whole number"),
        ("name,cpu_milli,num_gpu\na,1,-1\n", r"row 2, column 'num_gpu': must be >= 0"),
        ("name,cpu_milli,num_gpu,memory_mib\na,1,1,\n", r"row 2, column 'memory_mib': empty"),
        ("name,cpu_milli,num_gpu,gpu_milli\na,1,1,0.25\n", r"row 2, column 'gpu_milli': must be a whole number"),
        ("name,cpu_milli,num_gpu,gpu_milli\na,1,1,inf\n", r"row 2, column 'gpu_milli': must be a whole number"),
        ("job_id,cpu,num_gpu\n1,-0.5,1\n", r"row 2, column 'cpu': must be a finite number >= 0"),
        ("name,cpu_milli,num_gpu\n,1,1\n", r"row 2, column 'name': empty pod name"),
        ("name,cpu_milli,num_gpu\na,1,1\na,2,1\n", r"row 3: pod name 'a' already on row 2"),
        ("name,cpu_milli,num_gpu\na,1,1,9\n", r"row 2 has 4 field\(s\), the header has 3"),
        ("name,cpu_milli,num_gpu\na,1\n", r"row 2 has 2 field\(s\), the header has 3"),
        ("name,memory_mib,num_gpu\na,1,1\n", r"missing column\(s\) cpu_milli or cpu"),
        ("name,cpu_milli\na,1\n", r"missing column\(s\) num_gpu"),
        ("name,cpu_milli,num_gpu,num_gpu\na,1,1,1\n", r"column\(s\) 'num_gpu' appear more than once"),
        ("", r"p\.csv: empty file"),
    ],
)
def test_malformed_pod_files_name_file_row_and_column(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(TraceFormatError, match=message):
        read_pods_csv(_write(tmp_path / "p.csv", body))


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,1024,2,\n", r"row 2, column 'model': empty, but the node has 2"),
        ("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,1024,x,T4\n", r"row 2, column 'gpu': must be a number"),
        ("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,-1,2,T4\n", r"row 2, column 'memory_mib': must be >= 0"),
        ("sn,cpu_milli,memory_mib,gpu,model\nn0,1,1,1,T4\nn0,1,1,1,T4\n", r"row 3, column 'sn': node 'n0' already"),
        ("sn,cpu_milli,gpu,model\nn0,1,1,T4\n", r"nodes\.csv: missing column\(s\) memory_mib"),
    ],
)
def test_malformed_node_files_name_file_row_and_column(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(TraceFormatError, match=message):
        read_nodes_csv(_write(tmp_path / "nodes.csv", body))


def test_cli_reports_a_malformed_file_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = _write(tmp_path / "bad.csv", "name,cpu_milli,num_gpu\na,1,one\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["--nodes", str(NODES_CSV), "--pods", str(bad), "--seeds", "1", "--policy", "bestfit"])
    assert exit_info.value.code == 2
    assert "bad.csv: row 2, column 'num_gpu': must be a number, got 'one'" in capsys.readouterr().err


def test_the_real_default_trace_still_reads_unchanged() -> None:
    header, _rows, pods = read_pods_csv(PODS_CSV)
    assert len(pods) == 8152
    assert header[0] == "name"
    assert len(header) == 11
    assert len(read_nodes_csv(NODES_CSV)) == 1213


# --- several traces in one command -------------------------------------------------------------

NODES_BODY = "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,4,T4\nn1,96000,393216,8,G2\nn2,32000,65536,0,\n"


def test_several_traces_and_policies_make_one_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = _write(tmp_path / "nodes.csv", NODES_BODY)
    full = _write(
        tmp_path / "full.csv",
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
        "a,4000,8192,1,500,,LS,Running,0,10,0\nb,2000,4096,1,1000,T4,BE,Running,1,9,1\n"
        "c,1000,1024,0,0,,LS,Failed,2,8,2\nd,8000,8192,2,1000,,LS,Running,3,7,3\n",
    )
    multigpu = _write(
        tmp_path / "multigpu.csv",
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,4000,8192,4,1000\nb,2000,4096,1,300\nc,1000,1024,8,1000\n",
    )
    table = tmp_path / "out" / "table.csv"
    argv = ["--nodes", str(nodes), "--pods", str(full), str(multigpu), "--seeds", "1-2", "--policy", "bestfit,random"]
    assert main([*argv, "--outdir", str(tmp_path / "runs"), "--table", str(table), "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(d["trace"], d["policy"]) for d in lines] == [
        ("full", "bestfit"),
        ("full", "random"),
        ("multigpu", "bestfit"),
        ("multigpu", "random"),
    ]
    with table.open() as handle:
        reader = csv.DictReader(handle)
        assert reader.fieldnames is not None
        assert reader.fieldnames[:3] == ["trace", "policy", "seeds"]
        rows = list(reader)
    assert [(r["trace"], r["policy"], r["seeds"]) for r in rows] == [(d["trace"], d["policy"], "1-2") for d in lines]
    for row, data in zip(rows, lines, strict=True):
        assert int(row["pods_placed"]) == data["pods_placed"]
        assert int(row["pods_failed"]) == data["pods_failed"]
        for level in ("alloc_at_100", "alloc_at_130"):  # empty where a seed never reached the level
            mean = data[level]["mean"]
            assert row[f"{level}_mean"] == ("" if mean is None else str(mean))
    for trace, originals in (("full", "abcd"), ("multigpu", "abc")):
        for policy in ("bestfit", "random"):
            with (tmp_path / "runs" / trace / policy / "seed2" / "placements.csv").open() as handle:
                placed = list(csv.DictReader(handle))
            assert placed
            assert all(p["pod"].split("-tuned-")[0] in originals for p in placed)
    # every multigpu placement of a 4- or 8-GPU pod went to the one 8-GPU node or the 4-GPU one
    with (tmp_path / "runs" / "multigpu" / "bestfit" / "seed1" / "placements.csv").open() as handle:
        assert all(p["node"] in {"", "n0", "n1"} for p in csv.DictReader(handle))


def test_plain_output_is_the_same_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = _write(tmp_path / "nodes.csv", NODES_BODY)
    pods = _write(tmp_path / "p.csv", "name,cpu_milli,num_gpu\na,1000,1\nb,1000,2\n")
    assert main(["--nodes", str(nodes), "--pods", str(pods), "--seeds", "3,5-6", "--policy", "fgd,strand"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == [
        "trace",
        "policy",
        "seeds",
        "alloc_at_100_mean",
        "alloc_at_100_sd",
        "alloc_at_130_mean",
        "alloc_at_130_sd",
        "pods_placed",
        "pods_failed",
        "seconds",
    ]
    assert [line.split()[:3] for line in out[1:]] == [["p", "fgd", "3,5-6"], ["p", "strand", "3,5-6"]]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--policy", "bestfit,nope"], "nope"),
        (["--policy", "bestfit,,fgd"], "empty item in policy list"),
    ],
)
def test_bad_policy_lists_fail_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    nodes = _write(tmp_path / "nodes.csv", NODES_BODY)
    pods = _write(tmp_path / "p.csv", "name,cpu_milli,num_gpu\na,1000,1\n")
    table = tmp_path / "table.csv"
    with pytest.raises(SystemExit) as exit_info:
        main(["--nodes", str(nodes), "--pods", str(pods), "--seeds", "1", "--table", str(table), *extra])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert not table.exists()


def test_two_pod_files_with_the_same_name_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = _write(tmp_path / "nodes.csv", NODES_BODY)
    (tmp_path / "x").mkdir()
    first = _write(tmp_path / "p.csv", "name,cpu_milli,num_gpu\na,1000,1\n")
    second = _write(tmp_path / "x" / "p.csv", "name,cpu_milli,num_gpu\na,1000,1\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["--nodes", str(nodes), "--pods", str(first), str(second), "--seeds", "1", "--policy", "bestfit"])
    assert exit_info.value.code == 2
    assert "share the name 'p'" in capsys.readouterr().err
