try:
    from crow.cli import main
except KeyboardInterrupt:  # Ctrl-C while crow starts: it leaves as interrupted, without a traceback
    raise SystemExit(130) from None

main()
