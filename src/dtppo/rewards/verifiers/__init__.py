"""The built-in verifiers: one module per task, ``gsm8k`` (``gsm8k_reward``) and ``math`` (``math_reward``), each
scoring a response against a reference as 1.0 or 0.0; and ``steps``, which checks every arithmetic step of a
response (``step_rewards``: rewards at the steps' ends). None raises, each is bounded by construction; they run in
scoring processes, so importing this package imports no verifier (nor torch)."""
