"""vLLM serves an export-hf folder: its greedy tokens for two requests (a script run in .venv-vllm).

Run as ``python tests/vllm_probe.py EXPORT_DIR``. It starts vLLM's OpenAI-compatible server on a free local port
(the command the endpoint's worker runs), and asks it twice for 8 greedy tokens: ``/v1/completions`` with a prompt
of token ids, and ``/v1/chat/completions`` through the ``openai`` client, each with the ids of its prompt and answer
returned (``return_token_ids``). It prints one JSON line: per request, the prompt ids and vLLM's answer, which the
test holds against transformers' ``generate`` on the same folder and prompt.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request

from ports import free_port

MAX_TOKENS = 8
PROMPT_IDS = [5, 17, 42, 99, 7, 120, 64]
# The export's tokenizer has no chat template; this one joins the messages' text.
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


# The engine runs in the server's process (VLLM_ENABLE_V1_MULTIPROCESSING=0, vllm/envs.py): the same model loading,
# kernels, scheduler and API in one process, where the CPU build's default starts three (API server, engine core,
# one worker; vllm/platforms/cpu.py turns the single-process executor into the multiprocess one). That saves two
# imports of vLLM and torch, about 10 s of CPU per probe here (2026-12-06), with the same 8 tokens for both requests.
IN_ONE_PROCESS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def serve(folder: str, port: int, log) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", f"--model={folder}", "--served-model-name=probe",
         f"--port={port}", "--host=127.0.0.1", "--dtype=float32", "--max-model-len=64", "--max-num-seqs=2",
         "--enforce-eager", f"--chat-template={CHAT_TEMPLATE}"],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", **IN_ONE_PROCESS},
    )  # fmt: skip


def wait_healthy(port: int, server: subprocess.Popen, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"vLLM exited with {server.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"vLLM not healthy after {timeout_s} s")


def main(folder: str) -> None:
    from openai import OpenAI

    port = free_port()
    with open(os.path.join(os.environ.get("VLLM_PROBE_LOG_DIR", "."), "vllm-server.log"), "wb") as log:
        server = serve(folder, port, log)
        try:
            wait_healthy(port, server)
            client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
            completion = client.completions.create(
                model="probe", prompt=PROMPT_IDS, max_tokens=MAX_TOKENS, temperature=0,
                extra_body={"return_token_ids": True},
            )  # fmt: skip
            chat = client.chat.completions.create(
                model="probe", messages=[{"role": "user", "content": "The experts"}], max_tokens=MAX_TOKENS,
                temperature=0, extra_body={"return_token_ids": True},
            )  # fmt: skip
        finally:
            server.terminate()
            server.wait(timeout=60)
    report = {
        "completions": {
            "prompt": list(completion.choices[0].prompt_token_ids or PROMPT_IDS),
            "vllm": list(completion.choices[0].token_ids),
        },
        "chat": {
            "prompt": list(chat.prompt_token_ids),
            "vllm": list(chat.choices[0].token_ids),
            "text": chat.choices[0].message.content,
        },
    }
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
