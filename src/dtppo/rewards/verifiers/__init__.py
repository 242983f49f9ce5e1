"""The built-in verifiers, one module per task: ``gsm8k`` (``gsm8k_reward``) and ``math`` (``math_reward``).

Each scores a response against a reference as 1.0 or 0.0, never raises, and is bounded by construction; they run
in scoring processes, so importing this package imports neither verifier (nor torch)."""
