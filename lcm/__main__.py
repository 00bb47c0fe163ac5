"""``python -m lcm`` is the ``lcm`` command (useful where the console script is not on PATH)."""

from lcm.cli import main

if __name__ == "__main__":
    main()
