"""The error a user's mistake raises: reported as one line per problem, exit code 2."""


class ConfigError(Exception):
    """Invalid configuration or usage.

    Carries every problem found, so the user fixes them all in one go.
    """

    def __init__(self, problems: str | list[str]):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))

    def report(self) -> str:
        if len(self.problems) == 1:
            return f"tfrecipe: invalid configuration: {self.problems[0]}"
        lines = "\n".join(f"  - {p}" for p in self.problems)
        return f"tfrecipe: invalid configuration ({len(self.problems)} problems):\n{lines}"
