"""The `crow` command (the console script's entry) and `python -m crow`."""

from crow.interrupts import quit_on_interrupt


def run() -> None:
    quit_on_interrupt()  # before crow's imports: a Ctrl-C during them leaves quietly
    from crow.cli import main

    main()


if __name__ == "__main__":
    run()
