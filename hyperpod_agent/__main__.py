from hyperpod_agent.cli import main

main()
