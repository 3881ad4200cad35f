"""run/launch.failed_rank_line: after workers fail, the launcher's last line names the rank that
died (a signal from outside), or the one the others timed out waiting for (hung), else the first to
fail, with its pid and host and what is on disk. The failures are torch's own ProcessFailure
records, read from error files a worker writes through run/refuse.record_failure, as torchrun's
agent reads them; the multi-process runs that end this way are
tests/distributed/test_killed_rank.py."""

import json
import signal
import socket
from types import SimpleNamespace

import pytest
from torch.distributed.elastic.multiprocessing.errors import ErrorHandler, ProcessFailure

from ds_longctx.parallel.disk import PARTIAL_MARKER
from ds_longctx.run import refuse
from ds_longctx.run.launch import WAITED_EXACT_S, failed_rank_line
from ds_longctx.run.refuse import GAVE_UP_AT, record_failure

GLOO_TIMEOUT = (
    "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 15000ms for "
    "recv operation to complete"
)
GLOO_CLOSED = (
    "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:1"
)
HOST = socket.gethostname()


BASE = 1_800_000_000.0  # a whole second: late_s=0.1 and 0.9 fall in the same one


@pytest.fixture
def failure(tmp_path, monkeypatch):
    """failure(rank, exitcode, raised=None, late_s=0, exact=True): rank's ProcessFailure as the
    agent builds it, from the error file its worker wrote on `raised` at BASE + late_s (none: a
    process ended by a signal or os._exit); exact=False: torch's own record, whole seconds only."""

    made = []

    def make(rank, exitcode, raised=None, late_s: float = 0, exact: bool = True):
        made.append(rank)
        err = tmp_path / f"error_{len(made)}.json"  # one per worker, as the agent makes them
        if raised is not None:
            monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(err))
            try:
                raise RuntimeError(raised)
            except RuntimeError as e:
                with monkeypatch.context() as m:
                    m.setattr(refuse, "time", SimpleNamespace(time=lambda: BASE + late_s))
                    record_failure(e) if exact else ErrorHandler().record_exception(e)
        f = ProcessFailure(local_rank=rank, pid=4000 + rank, exitcode=exitcode, error_file=str(err))
        f.timestamp = int(BASE + late_s)  # what the agent reads: whole seconds
        return f

    return make


def test_the_last_line_names_the_rank_that_died_or_hung_and_what_is_on_disk(tmp_path, failure):
    died = {1: failure(1, -signal.SIGKILL), 0: failure(0, 1, GLOO_CLOSED)}
    assert failed_rank_line(died, 2, None) == (
        f"rank 1 (pid 4001 on {HOST}) died, killed by SIGKILL (from outside the run: kill, the OOM "
        f"killer); this launch saves nothing"
    )
    out = tmp_path / "run"
    (out / "checkpoints" / "step4").mkdir(parents=True)
    (out / "checkpoints" / "latest").write_text("step4")
    (out / "checkpoints" / ".tmp-step6").mkdir()
    (out / "checkpoints" / ".tmp-step6" / PARTIAL_MARKER).write_text("{}")
    kept = (
        f"the last complete checkpoint, {out / 'checkpoints' / 'step4'}, is unchanged: --resume "
        f"continues it (.tmp-step6: a partial save the next one removes)"
    )
    # gloo: rank 0 times out; the stopped rank 1, continued, finds its peer gone or times out
    # itself, late
    for late in (GLOO_CLOSED, GLOO_TIMEOUT):
        hung = {0: failure(0, 1, GLOO_TIMEOUT), 1: failure(1, 1, late, late_s=4)}
        assert failed_rank_line(hung, 2, str(out)) == (
            f"rank 1 (pid 4001 on {HOST}) hung: rank 0 gave up waiting for it in a collective "
            f"(parallel.collective_timeout_s); {kept}"
        )
    both = {r: failure(r, 1, GLOO_TIMEOUT) for r in (0, 1)}
    assert failed_rank_line(both, 2, None).startswith("every rank timed out in a collective")
    # NCCL: the watchdog aborts ranks 0, 2 and 3; rank 1 takes the agent's SIGKILL 30 s later
    nccl = {r: failure(r, -signal.SIGABRT) for r in (0, 2, 3)} | {
        1: failure(1, -signal.SIGKILL, late_s=31)
    }
    assert failed_rank_line(nccl, 4, str(out)).startswith(
        f"rank 1 (pid 4001 on {HOST}) hung: ranks 0, 2, 3 gave up waiting for it in a collective"
    )
    # an error of rank 0's own: rank 1, waiting for it, ended by the agent's SIGTERM
    error = {0: failure(0, 1, "boom"), 1: failure(1, -signal.SIGTERM)}
    assert failed_rank_line(error, 2, str(out)) == (
        f"rank 0 (pid 4000 on {HOST}) failed first (RuntimeError: boom; its traceback above); "
        f"{kept}"
    )
    # out of memory: os._exit(1) after its report, no error file
    assert failed_rank_line({1: failure(1, 1)}, 2, None) == (
        f"rank 1 (pid 4001 on {HOST}) failed first (exit code 1; its traceback above); this launch "
        f"saves nothing"
    )


def test_exact_times_name_a_stopped_rank_continued_within_the_survivors_second(failure, tmp_path):
    """A rank stopped (SIGSTOP) past the collective timeout, then continued, gives up at once, its
    own deadline long past: here within rank 0's whole second, or the next, where whole-second
    records (torch's own, the fallback) count it among the waiters. Each worker's exact time
    (run/refuse.GAVE_UP_AT) names it; waiters that gave up within WAITED_EXACT_S stay waiters."""
    one = f"rank 1 (pid 4001 on {HOST}) hung: rank 0 gave up waiting for it in a collective"
    every = "every rank timed out in a collective"
    for first, late in ((0.1, 0.9), (0.7, 1.6)):
        for exact, said in ((True, one), (False, every)):
            ranks = {
                0: failure(0, 1, GLOO_TIMEOUT, late_s=first, exact=exact),
                1: failure(1, 1, GLOO_TIMEOUT, late_s=late, exact=exact),
            }
            assert failed_rank_line(ranks, 2, None).startswith(said), (first, late, exact)
    # the record holds the time record_failure took, exactly
    record = json.loads((tmp_path / "error_1.json").read_text())["message"]["extraInfo"]
    assert (record[GAVE_UP_AT], record["timestamp"]) == (BASE + 0.1, str(int(BASE)))
    # three waiters across a second's boundary, rank 3 continued 0.7 s after the last of them
    late = {r: failure(r, 1, GLOO_TIMEOUT, late_s=t) for r, t in enumerate((0.95, 1.05, 1.2, 1.9))}
    assert failed_rank_line(late, 4, None).startswith(
        f"rank 3 (pid 4003 on {HOST}) hung: ranks 0, 1, 2 gave up waiting for it in a collective"
    )
    near = {
        r: failure(r, 1, GLOO_TIMEOUT, late_s=t) for r, t in ((0, 0.1), (1, 0.1 + WAITED_EXACT_S))
    }
    assert failed_rank_line(near, 2, None).startswith(every)
    # a record without an exact time is compared in whole seconds
    mixed = {
        0: failure(0, 1, GLOO_TIMEOUT, late_s=0.1),
        1: failure(1, 1, GLOO_TIMEOUT, late_s=0.9, exact=False),
    }
    assert failed_rank_line(mixed, 2, None).startswith(every)
