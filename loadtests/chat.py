"""Locust entry point for the `chat` workload (generator: loadtests/workloads/chat.py).

chat: a shared system prompt plus multi-turn conversations whose history grows.

Request stream (lengths in words at --length-scale 1; every length scales with it):
- system prompt: 300 words, identical for every user and conversation (prefix reuse
  across users);
- a conversation has 2-6 turns (uniform); each user message is 20-80 words (uniform);
  each reply asks for 32-96 tokens (uniform, `max_tokens`, EOS ignored);
- each turn resends the whole history (system + earlier turns + replies), so later turns
  reuse the earlier turns' KV (prefix reuse within a conversation); a conversation also
  ends once its history passes 1500 words.
Endpoint: /v1/chat/completions, streamed.
Default SLOs: TTFT <= 1.0 s and TPOT (mean inter-token gap of a request) <= 0.1 s.
Default load: 8 closed-loop users.

By hand: locust -f loadtests/chat.py --headless -u 4 -r 4 -t 30s --host http://127.0.0.1:8000
(options of loadtests/common.py: --samples-file, --seed, --arrival, --rate, ...)
"""
from loadtests.common import StreamingUser
from loadtests.workloads.chat import WORKLOAD


class ChatUser(StreamingUser):
    workload = WORKLOAD
