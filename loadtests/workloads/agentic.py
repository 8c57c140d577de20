"""agentic: multi-step tool-calling conversations (an agent loop) over a fixed tool set.

Request stream (lengths in words at --length-scale 1; every length scales with it):
- system prompt: the agent's instructions plus the JSON schemas of 4 fixed tools (TOOLS)
  in the Hermes layout (<tools>...</tools>, calls as <tool_call>{"name", "arguments"}
  </tool_call>), identical for every user and session (prefix reuse across users);
- a session is one task (a user message of 20-60 words) worked in 2-5 tool-calling steps
  (uniform), then a final answer;
- each step asks for a tool call (24-64 tokens, uniform, `max_tokens`, EOS ignored); the
  call the agent executes is the reply when it is a valid call of TOOLS, else the
  session's own seeded call (a random or simulated model writes no JSON, yet the history
  always follows the schema); the tool's result (a JSON object, 40-200 words) comes back
  as the next user turn inside <tool_response></tool_response>, as the Hermes chat
  template (examples/tool_chat_template_smollm2_hermes.jinja) renders a "tool" message,
  so every chat template takes it and no server flag is needed;
- every request is greedy (temperature 0, as agent loops call tools: the same state gives
  the same call);
- the final answer asks for 48-128 tokens; every request resends the whole history; a
  session answers early once its turns after the system prompt pass 1200 words (chat
  ends at 1500 words with its system prompt), or, when the driver knows the model's
  context (max_model_len), once one more step might leave no room for the answer: its
  history's tokens estimated at its last prompt's tokens per character as the server
  counted them (base.ContextBudget), a step at its longest (STEP_MARGIN x the longest
  seeded call and tool result), the answer at its longest (a small model's tokenizer
  spends ~3.5 tokens a word on this text: at --length-scale 0.25 the 2,048-token
  embedded model holds the system prompt and 1-2 steps, not 5).
Endpoint: /v1/chat/completions, streamed. The calls repeat the same scaffolding across
sessions (what suffix decoding drafts from: engine/spec_decode/).
Default SLOs: TTFT <= 1.0 s, TPOT <= 0.1 s, e2e <= 8.0 s (an agent waits on every step).
Default load: 6 closed-loop users.
"""
from __future__ import annotations

import functools
import json
import random

from loadtests.workloads.base import (BudgetedSession, ContextBudget, Request, WorkloadSpec,
                                      uniform, words)

TASK_WORDS = (20, 60)
STEPS = (2, 5)
CALL_TOKENS = (24, 64)
RESULT_WORDS = (40, 200)
ANSWER_TOKENS = (48, 128)
MAX_HISTORY_WORDS = 1200  # after the system prompt (whose tool schemas do not scale)
_SYSTEM_SEED = 20240637  # fixed: the instructions are the same for every user
INSTRUCTION_WORDS = 120
STEP_MARGIN = 1.2  # on the longest step's characters: the next step's own tokens per char


def _tool(name: str, description: str, **properties: str) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object",
                       "properties": {k: {"type": t} for k, t in properties.items()},
                       "required": list(properties)}}}


TOOLS = (
    _tool("search_docs", "Full-text search over the product documentation.",
          query="string", top_k="integer"),
    _tool("read_file", "Read a file of the repository.", path="string"),
    _tool("run_sql", "Run a read-only SQL query on the analytics database.",
          query="string", limit="integer"),
    _tool("get_ticket", "Fetch a support ticket by its number.", ticket_id="integer"),
)
_TYPES = {"string": str, "integer": int}


@functools.lru_cache(maxsize=16)
def system_prompt(scale: float = 1.0) -> str:
    rules = words(random.Random(_SYSTEM_SEED), max(1, round(INSTRUCTION_WORDS * scale)))
    schemas = "\n".join(json.dumps(t["function"], sort_keys=True) for t in TOOLS)
    return ("You are an operations agent. Work the user's task step by step with the tools; "
            f"house rules: {rules}\n\nYou may call one function per turn. The functions are "
            f"described by these JSON schemas:\n<tools>\n{schemas}\n</tools>\nTo call a "
            "function, answer with a JSON object holding its name and arguments inside "
            "<tool_call></tool_call> tags:\n<tool_call>\n{\"name\": <function-name>, "
            "\"arguments\": <arguments-object>}\n</tool_call>\nWhen the task is done, answer "
            "in plain text.")


def follows_schema(call: object) -> bool:
    """Whether `call` ({"name", "arguments"}) calls one of TOOLS with exactly its
    required arguments, each of its declared JSON type."""
    if not isinstance(call, dict) or set(call) != {"name", "arguments"}:
        return False
    tool = next((t["function"] for t in TOOLS if t["function"]["name"] == call["name"]), None)
    args = call["arguments"]
    if tool is None or not isinstance(args, dict):
        return False
    props = tool["parameters"]["properties"]
    return set(args) == set(tool["parameters"]["required"]) and all(
        type(args[k]) is _TYPES[props[k]["type"]] for k in args)  # bool is no integer


def parse_call(text: str) -> dict | None:
    """The call in a reply (`<tool_call>{...}</tool_call>`, tags optional) if it follows
    the schema, else None."""
    body = text.strip()
    if body.startswith("<tool_call>"):
        body = body[len("<tool_call>"):].split("</tool_call>", 1)[0]
    try:
        call = json.loads(body)
    except ValueError:
        return None
    return call if follows_schema(call) else None


def call_text(call: dict) -> str:
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"


def _seeded_call(rng: random.Random) -> dict:
    name = TOOLS[rng.randrange(len(TOOLS))]["function"]["name"]
    phrase = words(rng, rng.randint(3, 8)).replace(".", "")
    arguments = {
        "search_docs": lambda: {"query": phrase, "top_k": rng.randint(3, 10)},
        "read_file": lambda: {"path": "src/" + "_".join(phrase.split()[:3]) + ".py"},
        "run_sql": lambda: {"query": f"SELECT * FROM events WHERE note LIKE '%{phrase}%'",
                            "limit": rng.choice((10, 50, 100))},
        "get_ticket": lambda: {"ticket_id": rng.randint(1000, 99999)},
    }[name]()
    return {"name": name, "arguments": arguments}


def _tool_result(rng: random.Random, call: dict, scale: float) -> str:
    result = {"tool": call["name"], "status": "ok",  # longest_step_chars: the same layout
              "content": words(rng, uniform(rng, *RESULT_WORDS, scale=scale))}
    return f"<tool_response>\n{json.dumps(result)}\n</tool_response>"


@functools.lru_cache(maxsize=16)
def longest_step_chars(scale: float = 1.0) -> int:
    """Characters one step adds to the history at most, as far as a fixed sample of 256
    seeded calls and 256 tool results of the most words shows (STEP_MARGIN covers the rest,
    and a model's own, longer call: CALL_TOKENS)."""
    rng = random.Random(_SYSTEM_SEED)
    call = max(len(call_text(_seeded_call(rng))) for _ in range(256))
    most = max(1, round(RESULT_WORDS[1] * scale))
    result = max(len(json.dumps({"tool": "search_docs", "status": "ok",
                                 "content": words(rng, most)})) for _ in range(256))
    return call + result + len("<tool_response>\n\n</tool_response>")


class AgentSession(BudgetedSession):
    """One task: `steps` tool calls, each answered by a tool result, then a final answer.
    `messages` grows by two entries (the call, its result) per step."""

    kind = "agentic"

    def __init__(self, rng: random.Random, scale: float = 1.0) -> None:
        self._rng, self._scale = rng, scale
        self.steps = rng.randint(*STEPS)
        self.calls: list[dict] = []  # the calls the agent executed, in order
        self._done = False
        self.budget = ContextBudget()
        self.messages = [
            {"role": "system", "content": system_prompt(scale)},
            {"role": "user", "content": "Task: " + words(
                rng, uniform(rng, *TASK_WORDS, scale=scale))}]

    def next_request(self) -> Request | None:
        if self._done:
            return None
        chars = sum(len(m["content"]) for m in self.messages)
        answer = max(1, round(ANSWER_TOKENS[1] * self._scale))
        step = round(STEP_MARGIN * longest_step_chars(self._scale))
        final = (len(self.calls) >= self.steps
                 or sum(len(m["content"].split()) for m in self.messages[1:])
                 > MAX_HISTORY_WORDS * self._scale
                 or not self.budget.fits(chars + step, answer
                                         + max(1, round(CALL_TOKENS[1] * self._scale))))
        self._done = final
        if final and not self.budget.fits(chars, answer):
            return None  # not even the answer fits: the session ends unanswered
        self.budget.sent(chars)
        tokens = ANSWER_TOKENS if final else CALL_TOKENS
        return Request(self.kind, "/v1/chat/completions", {
            "messages": [dict(m) for m in self.messages],
            "max_tokens": uniform(self._rng, *tokens, scale=self._scale),
            "temperature": 0.0})

    def record_response(self, text: str, prompt_tokens: int | None = None) -> None:
        self.budget.served(prompt_tokens)
        if self._done:  # the final answer: the session is over
            self.messages.append({"role": "assistant", "content": text})
            return
        planned = _seeded_call(self._rng)  # drawn either way: one seed, one stream
        call = parse_call(text) or planned
        self.calls.append(call)
        self.messages.append({"role": "assistant", "content": call_text(call)})
        self.messages.append({"role": "user",
                              "content": _tool_result(self._rng, call, self._scale)})


WORKLOAD = WorkloadSpec(
    name="agentic",
    description="tool-calling agent loops: JSON calls in a fixed schema, results fed back",
    new_session=lambda rng, scale: AgentSession(rng, scale),
    slos={"agentic": {"ttft": 1.0, "tpot": 0.1, "e2e": 8.0}},
    primary_latency="e2e",
    users=6,
)
