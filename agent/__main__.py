from agent.apps.cli.main import main

main()
