from policy_engine.cli.main import entry

entry()
