"""``batchspec run-batch`` end to end on real vLLM (issue 37): the shipped prompts as an OpenAI
batch file, killed with -9 once, the same command run again to completion; the response file
checked line by line with vLLM's own pydantic models (``BatchRequestOutput`` from its
``run-batch``, ``CompletionResponse`` for a ``/v1/completions`` body, which vLLM's batch model
does not list): every line parses, every ``custom_id`` once, in input order."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import IN_PROCESS_ENGINE, PROMPTS, ROOT, run_cli, write_job

pytestmark = pytest.mark.engine
MODEL = "builtin:smollm2-135m-instruct"


def requests(path: Path) -> list[str]:
    """Six chat requests (one asking for log probabilities), a completions request and one
    naming another model; returns the custom_ids in order."""
    lines = []
    for r in pq.read_table(PROMPTS).slice(0, 6).to_pylist():
        body = {"model": MODEL, "messages": r["messages"], "max_completion_tokens": 8}
        lines.append({"custom_id": r["id"], "method": "POST", "url": "/v1/chat/completions",
                      "body": body})  # fmt: skip
    lines[3]["body"] |= {"logprobs": True, "top_logprobs": 2}
    lines.append({"custom_id": "completion", "method": "POST", "url": "/v1/completions",
                  "body": {"prompt": "The capital of France is", "max_tokens": 6}})  # fmt: skip
    other = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
    lines.append({"custom_id": "other-model", "method": "POST", "url": "/v1/chat/completions",
                  "body": other})  # fmt: skip
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return [line["custom_id"] for line in lines]


def test_run_batch_killed_and_rerun_writes_every_response_once_in_order(tmp_path: Path) -> None:
    ids = requests(tmp_path / "requests.jsonl")
    job = {"model": {"dtype": "float32", "max_model_len": 1024, "enforce_eager": True},
           "output": {"unit_rows": 2}, "execution": {"heartbeat_s": 0.5}}  # fmt: skip
    write_job(tmp_path / "job.yaml", job)
    out = tmp_path / "results.jsonl"
    args = ["run-batch", "-i", str(tmp_path / "requests.jsonl"), "-o", str(out), "--model", MODEL]
    args += ["--max-num-seqs", "2", "--job", str(tmp_path / "job.yaml"), "--no-progress"]
    args += ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}']
    env = {**os.environ, **IN_PROCESS_ENGINE}
    proc = subprocess.Popen([sys.executable, "-m", "batchspec", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)  # fmt: skip
    parts = tmp_path / "results.jsonl.batchspec" / "parts"
    deadline = time.monotonic() + 300
    while not list(parts.glob("*.parquet")):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no unit committed in time"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    assert not out.exists(), "the response file is written only once every request is answered"

    rerun = run_cli(*args, env=IN_PROCESS_ENGINE)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "wrote 8 responses in input order" in rerun.stdout
    check_responses(out, ids)


def check_responses(out: Path, ids: list[str]) -> None:
    from vllm.entrypoints.launchers.run_batch import BatchRequestOutput
    from vllm.entrypoints.openai.completion.protocol import CompletionResponse

    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["custom_id"] for line in lines] == ids
    for line in lines:
        if line["custom_id"] == "completion":
            CompletionResponse.model_validate(line["response"]["body"])
            BatchRequestOutput.model_validate(line | {"response": None})
            continue
        parsed = BatchRequestOutput.model_validate(line)
        if line["custom_id"] == "other-model":
            assert parsed.response.status_code == 400 and parsed.response.body is None
            assert "body.model 'gpt-4o' is not this job's model" in line["error"]["message"]
            continue
        assert parsed.error is None and parsed.response.status_code == 200
        body = parsed.response.body
        assert body.choices[0].message.content and body.usage.completion_tokens <= 8
        # The extension field kept: the job's method, or none where the controller took the
        # row's unit off speculation (K is priced from the first unit on).
        assert body.choices[0].batchspec["spec_method"] in ("ngram", "none")
    logprobs = lines[3]["response"]["body"]["choices"][0]["logprobs"]["content"]
    assert len(logprobs) == lines[3]["response"]["body"]["usage"]["completion_tokens"]
    assert all(len(p["top_logprobs"]) == 2 for p in logprobs)
