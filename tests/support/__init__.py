"""What the tests share, defined once: the tiny recipe and its fast overrides (``recipes``), running the CLI and
reading what it wrote (``cli``), made-up batches (``batches``), model directories and a reward model built in
seconds (``hf_fixtures``, ``reward_model_fixture``), the rank harness (``harness``), kill -9 trials (``killing``),
catalogues of answers and completions (``math_pairs``, ``hostile_catalogue``), and the user code tests load by
path (``failing_functions``, ``scripted_env``, ``episode_env``) or run as a script (``vllm_probe``)."""
