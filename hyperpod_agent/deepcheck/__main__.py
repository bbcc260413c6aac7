from hyperpod_agent.deepcheck.cli import main

main()
