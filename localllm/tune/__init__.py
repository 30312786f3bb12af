"""``localllm tune``: the settings llama.cpp leaves to the user, measured once per
model and machine (issue 50 item 3).

Pure logic, no engine: which candidates each setting has (``candidates``), how
a stage's measurements pick its winner (``choose``), the measuring loop with its
alternation, time left and partial result (``runner``), and the model's
``[models."NAME"]`` section of the config file (``section``). The command
(``localllm.commands.tune``) gives them the engine, the planner and the file.
"""
