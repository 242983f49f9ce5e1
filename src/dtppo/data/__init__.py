"""Problems (question, worked solution, final answer), their sources and the prompt loader."""
