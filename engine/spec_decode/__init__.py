"""Speculative decoding: an n-gram proposer (drafts from the request's own tokens) and the
verifier that keeps the target model's distribution exact. The scheduler asks the proposer
(torch-free); the engine hands the target's logits to the verifier."""
