"""A tokenizer of one id per word (the word's length), for tests of request streams:
lengths in tokens are the texts' word counts, easy to read off; the chat template is the
messages' words in order. Shared by tests/tuner and tests/loadtests (tests/ is on
sys.path: pytest puts the root conftest's folder there)."""


class WordTokenizer:
    def encode(self, text, **_):
        return [len(w) for w in text.split()]

    def apply_chat_template(self, messages, **_):
        return [len(w) for m in messages for w in m["content"].split()]
