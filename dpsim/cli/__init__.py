def main() -> int:
    raise SystemExit("dpsim: not yet")
