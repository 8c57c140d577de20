"""Speculative decoding: proposers (engine/spec_decode/proposer.py: the protocol the scheduler
holds and the registry by `method`; n-gram prompt lookup and suffix decoding implement it)
and the verifier that keeps the target model's distribution exact. The scheduler asks the
proposer (torch-free); the engine hands the target's logits to the verifier."""
