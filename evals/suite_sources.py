"""Hand-written material for the built-in eval suites (see evals/make_suites.py, which turns it into JSONL).

Everything here was written for this project: conversations, sentences with their translations, short
questions with reference answers, math templates, retrieval passages, code tasks with reference solutions
and list-style questions. Nothing is taken from another benchmark.

A reference given as a tuple lists acceptable alternatives for one turn (stored as a list of texts; quality is
scored against the best-matching one).
"""
from __future__ import annotations

# ------------------------------------------------------------------------------------------ conversation
# Each entry: the user turns of one conversation, run turn by turn with the model's own earlier answers.
CONVERSATIONS: list[list[str]] = [
    ["I'm planning a birthday party for my 8-year-old daughter. Can you suggest a theme?",
     "She loves animals. Can you plan three games that fit that theme?"],
    ["What is a Python decorator?",
     "Show me a decorator that prints how long a function takes to run.",
     "Can it also print the name of the function it wraps?"],
    ["Can you recommend a simple dinner I can cook in 20 minutes?",
     "I don't eat meat. How would you change the recipe?"],
    ["Explain what an API is in simple terms.",
     "Now explain it as if I were ten years old."],
    ["Write a short poem about autumn.",
     "Make it rhyme and keep it to four lines."],
    ["I want to start running. How should I begin?",
     "How do I avoid injuries in the first month?"],
    ["What is the difference between a process and a thread?",
     "When would I choose processes over threads in Python?"],
    ["Help me write an email asking my manager for a day off next Friday.",
     "Make it more formal and shorter."],
    ["How does the knight move in chess?",
     "And how does castling work?"],
    ["I have a list of numbers in Python. How do I sort it in descending order?",
     "What if it is a list of dictionaries and I want to sort them by the key 'age'?"],
    ["Suggest a name for a coffee shop next to a library.",
     "Give me three more, each with a one-line slogan."],
    ["What is compound interest?",
     "If I invest 1,000 dollars at 5% interest per year, how much will I have after 3 years?",
     "And after 10 years?"],
    ["Explain what a Git branch is.",
     "How do I merge my branch back into main?"],
    ["Tell me an interesting fact about octopuses.",
     "Tell me another one, this time about how they change colour."],
    ["I'm learning Spanish. How do I ask where the train station is?",
     "How might someone answer me, and what would the answer mean?"],
    ["Write a Python function that checks whether a string looks like a valid email address.",
     "Now add a few pytest tests for it."],
    ["What is the greenhouse effect?",
     "What can one person do to reduce their contribution to it?"],
    ["The leaves of my houseplant are turning yellow. What could be wrong?",
     "I water it every day. Could that be the problem?"],
    ["Summarize the story of Cinderella in three sentences.",
     "Now retell it as if it happened in a modern city."],
    ["How do I create a virtual environment in Python?",
     "How do I save the packages I installed to a requirements file?",
     "How do I install them again on another machine?"],
    ["I need a weekly workout plan for a beginner, three days a week.",
     "Replace the running with something that is easier on the knees."],
    ["What is the difference between weather and climate?",
     "Give me one example of each."],
    ["Explain recursion with a simple example.",
     "What happens if a recursive function has no base case?"],
    ["Can you help me name my new puppy? She is a small brown terrier.",
     "I like short names that start with the letter B."],
    ["What does a JOIN do in SQL?",
     "Show the difference between an INNER JOIN and a LEFT JOIN with two small tables."],
    ["I'm visiting Rome for two days. What should I see?",
     "I'm travelling with a toddler. How would you change the plan?"],
    ["What is a hash table?",
     "Why are lookups in a hash table usually fast?"],
    ["Write a haiku about the sea.",
     "Now write one about mountains in the same style."],
    ["How do I read a CSV file in Python?",
     "How can I skip the header row and turn the second column into integers?"],
    ["What should I look for in a laptop for programming?",
     "My budget is 800 dollars. What would you prioritise?"],
    ["Explain the difference between 'affect' and 'effect'.",
     "Write two sentences that use each word correctly."],
    ["What is a regular expression?",
     "Write one that matches a date in the form YYYY-MM-DD and explain each part."],
    ["I want to learn to cook. Which basic skills should I practise first?",
     "Which of those should I start with this weekend, and how?"],
    ["What is the difference between == and is in Python?",
     "Give an example where the two give different results."],
]

# ------------------------------------------------------------------------------------------ translation
# (source language, target language, text, reference translation or a tuple of acceptable ones)
TRANSLATIONS: list[tuple[str, str, str, str | tuple[str, ...]]] = [
    ("English", "French", "The meeting has been moved to Thursday afternoon because the manager is travelling.",
     "La réunion a été déplacée à jeudi après-midi parce que le responsable est en déplacement."),
    ("English", "French", "Please save your work before closing the program; unsaved changes will be lost.",
     "Veuillez enregistrer votre travail avant de fermer le programme ; les modifications non enregistrées "
     "seront perdues."),
    ("English", "French", "The library is open every day except Sunday, from nine in the morning until six in "
     "the evening.",
     "La bibliothèque est ouverte tous les jours sauf le dimanche, de neuf heures du matin à six heures du soir."),
    ("English", "French", "This function returns the number of lines in the file, including empty lines.",
     "Cette fonction renvoie le nombre de lignes du fichier, y compris les lignes vides."),
    ("English", "French", "We walked along the river until sunset, then took the last train home.",
     "Nous avons marché le long de la rivière jusqu'au coucher du soleil, puis nous avons pris le dernier "
     "train pour rentrer."),
    ("English", "French", "If the password is entered wrongly three times in a row, the account is locked for "
     "one hour.",
     "Si le mot de passe est mal saisi trois fois de suite, le compte est bloqué pendant une heure."),
    ("English", "French", "My sister is learning to play the piano, and she practises for an hour every evening.",
     "Ma sœur apprend à jouer du piano, et elle s'exerce une heure chaque soir."),
    ("English", "French", "The new version is faster and uses less memory than the previous one.",
     "La nouvelle version est plus rapide et utilise moins de mémoire que la précédente."),
    ("English", "French", "Could you tell me where the nearest pharmacy is?",
     "Pourriez-vous me dire où se trouve la pharmacie la plus proche ?"),
    ("French", "English", "Le train pour Lyon part à huit heures quinze du quai numéro trois.",
     ("The train to Lyon leaves at a quarter past eight from platform three.",
      "The train for Lyon departs at 8:15 from platform number three.")),
    ("French", "English", "Il faut arroser les tomates tous les deux jours quand il fait chaud.",
     ("The tomatoes need watering every other day when it is hot.",
      "You have to water the tomatoes every two days when it is hot.")),
    ("French", "English", "Le fichier de configuration se trouve dans le répertoire personnel de l'utilisateur.",
     ("The configuration file is in the user's home directory.",
      "The configuration file is located in the user's home directory.")),
    ("English", "German", "The weather will be sunny tomorrow, but it may rain in the evening.",
     "Morgen wird es sonnig, aber am Abend kann es regnen."),
    ("English", "German", "The program reads the data from a CSV file and writes a short report.",
     "Das Programm liest die Daten aus einer CSV-Datei und schreibt einen kurzen Bericht."),
    ("English", "German", "I have lived in this city for ten years, and I still discover new streets.",
     "Ich lebe seit zehn Jahren in dieser Stadt und entdecke immer noch neue Straßen."),
    ("English", "German", "Please make sure that all windows are closed before you leave the building.",
     "Bitte stellen Sie sicher, dass alle Fenster geschlossen sind, bevor Sie das Gebäude verlassen."),
    ("English", "German", "The test failed because the expected value was different from the actual value.",
     "Der Test ist fehlgeschlagen, weil der erwartete Wert vom tatsächlichen Wert abwich."),
    ("English", "German", "We need two kilos of potatoes, a bag of onions and some fresh parsley.",
     "Wir brauchen zwei Kilo Kartoffeln, einen Beutel Zwiebeln und etwas frische Petersilie."),
    ("English", "German", "The museum offers free admission to children under twelve.",
     "Das Museum bietet Kindern unter zwölf Jahren freien Eintritt."),
    ("English", "German", "Restart the computer after installing the update.",
     "Starten Sie den Computer nach der Installation des Updates neu."),
    ("English", "German", "She wrote a long letter to her grandmother and posted it the next morning.",
     "Sie schrieb ihrer Großmutter einen langen Brief und schickte ihn am nächsten Morgen ab."),
    ("German", "English", "Der Zug hatte zwanzig Minuten Verspätung, deshalb habe ich den Anschluss verpasst.",
     ("The train was twenty minutes late, so I missed my connection.",
      "The train was delayed by twenty minutes, which is why I missed the connection.")),
    ("German", "English", "Die Funktion gibt eine leere Liste zurück, wenn keine Einträge gefunden werden.",
     ("The function returns an empty list if no entries are found.",
      "The function returns an empty list when no entries are found.")),
    ("German", "English", "Im Sommer fahren wir oft mit dem Fahrrad an den See.",
     ("In summer we often cycle to the lake.",
      "In the summer we often ride our bikes to the lake.")),
    ("English", "Spanish", "The restaurant on the corner serves the best soup in town.",
     "El restaurante de la esquina sirve la mejor sopa de la ciudad."),
    ("English", "Spanish", "Write the results to a new file instead of overwriting the original.",
     "Escribe los resultados en un archivo nuevo en lugar de sobrescribir el original."),
    ("English", "Spanish", "Our flight was cancelled, so we spent the night at a hotel near the airport.",
     "Nuestro vuelo fue cancelado, así que pasamos la noche en un hotel cerca del aeropuerto."),
    ("English", "Spanish", "The children planted three apple trees in the school garden.",
     "Los niños plantaron tres manzanos en el jardín de la escuela."),
    ("English", "Spanish", "Each user can create up to five projects with the free plan.",
     "Cada usuario puede crear hasta cinco proyectos con el plan gratuito."),
    ("English", "Spanish", "It is important to drink enough water when you exercise.",
     "Es importante beber suficiente agua cuando haces ejercicio."),
    ("English", "Spanish", "The error message appears when the disk is full.",
     "El mensaje de error aparece cuando el disco está lleno."),
    ("English", "Spanish", "My brother works as a nurse at the hospital in the city centre.",
     "Mi hermano trabaja como enfermero en el hospital del centro de la ciudad."),
    ("English", "Spanish", "Turn left at the second traffic light, and the station is on your right.",
     "Gira a la izquierda en el segundo semáforo y la estación está a tu derecha."),
    ("Spanish", "English", "La biblioteca cierra a las ocho durante la semana y a las dos los sábados.",
     ("The library closes at eight during the week and at two on Saturdays.",
      "The library closes at 8 on weekdays and at 2 on Saturdays.")),
    ("Spanish", "English", "Antes de ejecutar el programa, instala las dependencias con pip.",
     ("Before running the program, install the dependencies with pip.",
      "Install the dependencies with pip before you run the program.")),
    ("Spanish", "English", "Mañana vamos a visitar a mis abuelos en el campo.",
     ("Tomorrow we are going to visit my grandparents in the countryside.",
      "Tomorrow we will visit my grandparents in the country.")),
    ("English", "Chinese", "The meeting starts at ten o'clock tomorrow morning.",
     "会议明天上午十点开始。"),
    ("English", "Chinese", "Please read the instructions carefully before you begin.",
     "开始之前，请仔细阅读说明。"),
    ("Chinese", "English", "这个函数返回列表中最大的元素。",
     ("This function returns the largest element in the list.",
      "This function returns the biggest item in the list.")),
    ("Chinese", "English", "我每天早上骑自行车去上班。",
     ("I ride my bike to work every morning.",
      "Every morning I cycle to work.")),
]

# ------------------------------------------------------------------------------------------ question answering
# (question, reference answer or a tuple of acceptable answers)
QA: list[tuple[str, str | tuple[str, ...]]] = [
    ("What is the capital of Australia?", "The capital of Australia is Canberra."),
    ("Which planet is closest to the Sun?", "Mercury is the planet closest to the Sun."),
    ("What is the chemical formula of water?", ("The chemical formula of water is H2O.", "H2O")),
    ("How many sides does a hexagon have?", "A hexagon has six sides."),
    ("Who wrote the play Romeo and Juliet?", "William Shakespeare wrote Romeo and Juliet."),
    ("At what temperature in degrees Celsius does water boil at sea level?",
     "At sea level, water boils at 100 degrees Celsius."),
    ("Which gas do plants take in from the air for photosynthesis?",
     ("Plants take in carbon dioxide for photosynthesis.", "Carbon dioxide (CO2)")),
    ("What is the largest ocean on Earth?", "The Pacific Ocean is the largest ocean on Earth."),
    ("In which year did people first walk on the Moon?", "People first walked on the Moon in 1969."),
    ("What is the smallest prime number?", "The smallest prime number is 2."),
    ("How many bits are there in a byte?", "A byte has 8 bits."),
    ("What does CPU stand for?", "CPU stands for central processing unit."),
    ("What does HTTP stand for?", "HTTP stands for Hypertext Transfer Protocol."),
    ("Which organ pumps blood around the human body?", "The heart pumps blood around the body."),
    ("What is the longest river in South America?", "The Amazon is the longest river in South America."),
    ("At what temperature in degrees Fahrenheit does water freeze?", "Water freezes at 32 degrees Fahrenheit."),
    ("Who developed the theory of general relativity?",
     "Albert Einstein developed the theory of general relativity."),
    ("What is the hardest naturally occurring material?", "Diamond is the hardest naturally occurring material."),
    ("How many continents are there?",
     ("There are seven continents.",
      "There are seven continents: Africa, Antarctica, Asia, Australia, Europe, North America and "
      "South America.")),
    ("What is the official language of Brazil?", "The official language of Brazil is Portuguese."),
    ("What is the square root of 144?", "The square root of 144 is 12."),
    ("Which chemical element has the symbol Fe?", "Fe is the symbol of iron."),
    ("In Python, what does len([1, 2, 3]) return?", "len([1, 2, 3]) returns 3."),
    ("Which Python keyword starts a function definition?", "The def keyword starts a function definition."),
    ("What does the // operator do in Python?",
     "In Python, // is floor division: it divides and rounds the result down to a whole number."),
    ("What is the main difference between a list and a tuple in Python?",
     "A list is mutable and can be changed after it is created, while a tuple is immutable."),
    ("Which module of the Python standard library provides regular expressions?",
     "The re module provides regular expressions."),
    ("What does 'abc'.upper() return in Python?", ("It returns 'ABC'.", "'ABC'")),
    ("What does a Python function return if it has no return statement?", "It returns None."),
    ("Which Python standard library module reads and writes JSON?", "The json module reads and writes JSON."),
    ("What does SQL stand for?", "SQL stands for Structured Query Language."),
    ("What is the value of 2 ** 10 in Python?", "2 ** 10 is 1024."),
    ("What does the command git clone do?",
     "git clone copies an existing Git repository, with its history, into a new directory."),
    ("Which data structure works on a last-in, first-out basis?",
     "A stack works on a last-in, first-out (LIFO) basis."),
    ("What is the time complexity of binary search on a sorted list?",
     ("Binary search takes O(log n) time.", "O(log n)")),
    ("Which HTTP status code means Not Found?", "The status code 404 means Not Found."),
    ("How many minutes are there in a day?", ("There are 1440 minutes in a day.", "1,440 minutes")),
    ("What is the largest planet in the solar system?", "Jupiter is the largest planet in the solar system."),
    ("What is the currency of Japan?", "The currency of Japan is the yen."),
    ("Who formulated the three laws of motion?", "Isaac Newton formulated the three laws of motion."),
]

# ------------------------------------------------------------------------------------------ math
# Word-problem templates: (name, text with {placeholders}, draw) where draw(rng) returns the placeholder values
# and the exact integer "answer". make_suites draws the values with a fixed seed.
MATH_SUFFIX = " Work it out step by step, then give the final answer as a number on the last line."


def _change(r):
    while True:
        p, n, b = r.randint(15, 95), r.randint(3, 12), r.choice((5, 10, 20))
        if b * 100 > p * n:
            return {"p": p, "n": n, "b": b, "answer": b * 100 - p * n}


def _train(r):
    while True:
        v, h, w, k = r.randint(6, 14) * 10, r.randint(2, 5), r.randint(4, 12) * 10, r.randint(2, 4)
        if v != w:
            break
    return {"v": v, "h": h, "w": w, "k": k, "answer": v * h + w * k}


def _recipe(r):
    per, s = r.randint(40, 90), r.randint(2, 6)
    t = r.choice([x for x in range(2, 13) if x != s])
    return {"a": per * s, "s": s, "t": t, "answer": per * t}


def _marbles(r):
    a, b, c, d = r.randint(20, 80), r.randint(5, 19), r.randint(2, 6), r.randint(5, 15)
    return {"a": a, "b": b, "c": c, "d": d, "answer": a - b + c * d}


def _fence(r):
    l, w, g = r.randint(8, 40), r.randint(5, 25), r.randint(1, 4)
    return {"l": l, "w": w, "g": g, "answer": 2 * (l + w) - g}


def _pages(r):
    while True:
        p, q, d = r.randint(180, 600), r.randint(12, 40), r.randint(3, 10)
        if p > q * d:
            return {"p": p, "r": q, "d": d, "answer": p - q * d}


def _sale(r):
    c, pct = r.randint(2, 10) * 20, r.choice((10, 20, 25, 50))
    return {"c": c, "pct": pct, "answer": c * (100 - pct) // 100}


def _buses(r):
    while True:
        c, s, b = r.randint(3, 9), r.randint(18, 32), r.randint(35, 55)
        if (c * s) % b:
            return {"c": c, "s": s, "b": b, "answer": -(-(c * s) // b)}


def _workers(r):
    while True:
        w, d, w2 = r.randint(2, 12), r.randint(3, 20), r.randint(2, 15)
        if w != w2 and (w * d) % w2 == 0:
            return {"w": w, "d": d, "w2": w2, "answer": w * d // w2}


def _ages(r):
    while True:
        a, k, y = r.randint(5, 14), r.randint(3, 5), r.randint(2, 15)
        if a * k < 60:
            return {"a": a, "k": k, "y": y, "answer": a * k + y}


def _temperature(r):
    t, q = r.randint(-5, 12), r.randint(2, 4)
    return {"t": t, "r": q, "answer": t + 6 * q}


def _tank(r):
    q, m, s = r.randint(4, 15), r.randint(5, 40), r.randint(2, 20) * 10
    return {"cap": s + q * m, "s": s, "r": q, "answer": m}


MATH_TEMPLATES = [
    ("change", "A shop sells pencils for {p} cents each. Maya buys {n} pencils and pays with a {b}-dollar note. "
     "How much change does she get, in cents?", _change),
    ("train", "A train travels at {v} km/h for {h} hours, then at {w} km/h for {k} hours. How many kilometres "
     "does it travel in total?", _train),
    ("recipe", "A recipe needs {a} grams of flour for {s} servings. How many grams of flour are needed for {t} "
     "servings?", _recipe),
    ("marbles", "Tom has {a} marbles. He gives {b} of them to his sister and then buys {c} bags of {d} marbles "
     "each. How many marbles does he have now?", _marbles),
    ("fence", "A rectangular garden is {l} metres long and {w} metres wide. A fence goes all around it except "
     "for a gate {g} metres wide. How many metres of fence are needed?", _fence),
    ("pages", "A book has {p} pages. Sara reads {r} pages every day. How many pages are left after {d} days?",
     _pages),
    ("sale", "A jacket costs {c} dollars. In a sale it is {pct}% off. What is the sale price in dollars?", _sale),
    ("buses", "A school has {c} classes of {s} students each. Each bus can carry {b} students. How many buses "
     "are needed to take every student on a trip?", _buses),
    ("workers", "{w} workers can paint a building in {d} days. How many days would {w2} workers need, working "
     "at the same rate?", _workers),
    ("ages", "Ana is {a} years old. Her father is {k} times as old as she is. How old will her father be in {y} "
     "years?", _ages),
    ("temperature", "At 6 a.m. the temperature was {t} degrees Celsius. It rose by {r} degrees every hour until "
     "noon. What was the temperature at noon, in degrees Celsius?", _temperature),
    ("tank", "A water tank holds {cap} litres and already contains {s} litres. A pump adds {r} litres per "
     "minute. How many minutes does it take to fill the tank?", _tank),
]

# ------------------------------------------------------------------------------------------ retrieval-augmented
# (documents, question, reference answer)
RAG_HANDWRITTEN: list[tuple[list[str], str, str]] = [
    (["Greenfield Library opens at 9 a.m. on weekdays and at 10 a.m. on Saturdays. It is closed on Sundays and "
      "public holidays.",
      "Members may borrow up to eight books at a time. The loan period is three weeks, and a loan can be "
      "extended twice online.",
      "The library café on the ground floor serves coffee and sandwiches until 4 p.m."],
     "How long is the loan period, and how many times can a loan be extended?",
     "The loan period is three weeks, and a loan can be extended twice online [2]."),
    (["Version 2.3 adds exporting reports as PDF and fixes a crash when opening empty files.",
      "Version 2.4 drops support for Python 3.8 and makes the command-line tool show progress by default.",
      "Version 2.5 introduces plugins, which are loaded from the plugins folder next to the configuration file."],
     "In which version was support for Python 3.8 dropped?",
     "Support for Python 3.8 was dropped in version 2.4 [2]."),
    (["Employees must book flights at least 14 days before departure unless the trip is urgent.",
      "Hotel costs are reimbursed up to 150 euros per night in most cities and up to 220 euros per night in "
      "London, Paris and Zurich.",
      "Meals are reimbursed up to 45 euros per day; alcohol is not reimbursed."],
     "What is the most a hotel night in Paris is reimbursed?",
     "A hotel night in Paris is reimbursed up to 220 euros [2]."),
    (["Lake Verna lies at an altitude of 1,240 metres and is usually frozen from December to March.",
      "Swimming is allowed at the north beach from June to September, when lifeguards are on duty from 10 a.m. "
      "to 6 p.m.",
      "Boats with petrol engines are banned on the lake; electric boats can be rented at the marina."],
     "When are lifeguards on duty at the north beach?",
     "Lifeguards are on duty at the north beach from 10 a.m. to 6 p.m., from June to September [2]."),
    (["Every request must include an API key in the X-Api-Key header.",
      "The free tier allows 1,000 requests per day; requests beyond the limit receive the status code 429.",
      "The /v2/search endpoint takes a q parameter and returns at most 50 results per page."],
     "What happens when a free-tier user goes over the daily limit?",
     "Requests beyond the free tier's limit of 1,000 per day receive the status code 429 [2]."),
    (["The beginner bread course runs on four Tuesday evenings and costs 120 euros, ingredients included.",
      "Participants should bring an apron and a container to take their bread home.",
      "The advanced pastry course requires the beginner course or a short practical test."],
     "What should participants bring to the bread course?",
     "Participants should bring an apron and a container to take their bread home [2]."),
    (["The museum's east wing, with the Roman collection, is closed for renovation until May.",
      "Guided tours in English start at 11 a.m. and 3 p.m. and last about ninety minutes.",
      "Admission is free for students with a valid card and costs 14 euros for other adults."],
     "How much does admission cost for an adult who is not a student?",
     "Admission costs 14 euros for adults who are not students [3]."),
    (["To reset your router, hold the button on the back for ten seconds until the light blinks orange.",
      "After a reset, the Wi-Fi name and password are the ones printed on the label under the router.",
      "Firmware updates are installed automatically every night between 2 and 4 a.m."],
     "After a reset, what are the Wi-Fi name and password?",
     "After a reset, the Wi-Fi name and password are the ones printed on the label under the router [2]."),
]

# ------------------------------------------------------------------------------------------ code generation
# (task, reference solution, assertions the reference passes; empty when the task touches files or time)
CODE_TASKS: list[tuple[str, str, str]] = [
    ("Write a Python function `count_words(text)` that returns a dict mapping each whitespace-separated word "
     "in `text` to the number of times it occurs.",
     'def count_words(text):\n    counts = {}\n    for word in text.split():\n'
     '        counts[word] = counts.get(word, 0) + 1\n    return counts\n',
     'assert count_words("a b a") == {"a": 2, "b": 1}\nassert count_words("") == {}\n'),
    ("Write a Python generator function `chunked(iterable, size)` that yields successive lists of at most "
     "`size` items from `iterable`.",
     'def chunked(iterable, size):\n    chunk = []\n    for item in iterable:\n        chunk.append(item)\n'
     '        if len(chunk) == size:\n            yield chunk\n            chunk = []\n    if chunk:\n'
     '        yield chunk\n',
     'assert list(chunked(range(5), 2)) == [[0, 1], [2, 3], [4]]\nassert list(chunked([], 3)) == []\n'),
    ("Write a Python function `flatten(nested)` that returns a flat list of the items in a list of lists.",
     'def flatten(nested):\n    return [item for sub in nested for item in sub]\n',
     'assert flatten([[1, 2], [], [3]]) == [1, 2, 3]\n'),
    ("Write a Python function `is_palindrome(s)` that returns True if `s` reads the same forwards and "
     "backwards, ignoring case and any character that is not a letter or digit.",
     'def is_palindrome(s):\n    chars = [c.lower() for c in s if c.isalnum()]\n    return chars == chars[::-1]\n',
     'assert is_palindrome("A man, a plan, a canal: Panama")\nassert not is_palindrome("python")\n'),
    ("Write a Python function `parse_version(version)` that turns a version string such as \"3.11.4\" into a "
     "tuple of integers.",
     'def parse_version(version):\n    return tuple(int(part) for part in version.split("."))\n',
     'assert parse_version("3.11.4") == (3, 11, 4)\n'),
    ("Write a Python function `human_size(n)` that formats a number of bytes as a short string with one "
     "decimal and a unit from B, KB, MB, GB and TB (1024 per step), e.g. human_size(1536) == \"1.5 KB\".",
     'def human_size(n):\n    units = ["B", "KB", "MB", "GB", "TB"]\n    size = float(n)\n'
     '    for unit in units[:-1]:\n        if size < 1024:\n            return f"{size:.1f} {unit}"\n'
     '        size /= 1024\n    return f"{size:.1f} {units[-1]}"\n',
     'assert human_size(1536) == "1.5 KB"\nassert human_size(10) == "10.0 B"\n'
     'assert human_size(3 * 1024 ** 3) == "3.0 GB"\n'),
    ("Write a Python function `merge_dicts(*dicts)` that merges several dictionaries into a new one, where "
     "later values win.",
     'def merge_dicts(*dicts):\n    merged = {}\n    for d in dicts:\n        merged.update(d)\n    return merged\n',
     'assert merge_dicts({"a": 1}, {"a": 2, "b": 3}) == {"a": 2, "b": 3}\n'),
    ("Write a Python function `unique(items)` that returns the items in their original order with duplicates "
     "removed (the items are hashable).",
     'def unique(items):\n    seen = set()\n    result = []\n    for item in items:\n'
     '        if item not in seen:\n            seen.add(item)\n            result.append(item)\n    return result\n',
     'assert unique([3, 1, 3, 2, 1]) == [3, 1, 2]\n'),
    ("Write a Python function `clamp(value, low, high)` that returns `value` limited to the range low..high.",
     'def clamp(value, low, high):\n    return max(low, min(value, high))\n',
     'assert clamp(5, 0, 3) == 3 and clamp(-1, 0, 3) == 0 and clamp(2, 0, 3) == 2\n'),
    ("Write a Python function `fibonacci(n)` that returns a list of the first n Fibonacci numbers, "
     "starting 0, 1, 1, 2.",
     'def fibonacci(n):\n    result = []\n    a, b = 0, 1\n    for _ in range(n):\n        result.append(a)\n'
     '        a, b = b, a + b\n    return result\n',
     'assert fibonacci(6) == [0, 1, 1, 2, 3, 5]\nassert fibonacci(0) == []\n'),
    ("Write a Python class `Stack` with methods `push(item)`, `pop()`, `peek()` and `is_empty()`, and "
     "support for `len()`. `pop` and `peek` raise IndexError on an empty stack.",
     'class Stack:\n    def __init__(self):\n        self._items = []\n\n    def push(self, item):\n'
     '        self._items.append(item)\n\n    def pop(self):\n        if not self._items:\n'
     '            raise IndexError("pop from an empty stack")\n        return self._items.pop()\n\n'
     '    def peek(self):\n        if not self._items:\n            raise IndexError("peek at an empty stack")\n'
     '        return self._items[-1]\n\n    def is_empty(self):\n        return not self._items\n\n'
     '    def __len__(self):\n        return len(self._items)\n',
     's = Stack()\ns.push(1)\ns.push(2)\nassert len(s) == 2 and s.peek() == 2 and s.pop() == 2\n'
     'assert s.pop() == 1 and s.is_empty()\n'),
    ("Write a Python context manager class `Timer` that measures the time spent inside its `with` block and "
     "stores it in seconds in the attribute `elapsed`.",
     'import time\n\n\nclass Timer:\n    def __enter__(self):\n        self.start = time.perf_counter()\n'
     '        return self\n\n    def __exit__(self, exc_type, exc, tb):\n'
     '        self.elapsed = time.perf_counter() - self.start\n        return False\n',
     'with Timer() as t:\n    pass\nassert t.elapsed >= 0\n'),
    ("Write a Python function `read_config(path)` that reads an INI-style configuration file and returns a "
     "dict mapping each section name to a dict of its options and their string values.",
     'import configparser\n\n\ndef read_config(path):\n    parser = configparser.ConfigParser()\n'
     '    parser.read(path)\n    return {section: dict(parser[section]) for section in parser.sections()}\n',
     ''),
    ("Write a Python function `walk_files(root, suffix)` that returns the paths of all files under the folder "
     "`root` (recursively) whose name ends with `suffix`.",
     'import os\n\n\ndef walk_files(root, suffix):\n    result = []\n'
     '    for dirpath, _dirnames, filenames in os.walk(root):\n        for name in filenames:\n'
     '            if name.endswith(suffix):\n                result.append(os.path.join(dirpath, name))\n'
     '    return result\n',
     ''),
    ("Write a Python function `write_json(path, data)` that writes `data` to `path` as indented JSON, "
     "replacing the file atomically (write a temporary file in the same folder, then rename it).",
     'import json\nimport os\nimport tempfile\n\n\ndef write_json(path, data):\n'
     '    folder = os.path.dirname(os.path.abspath(path))\n'
     '    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")\n    try:\n'
     '        with os.fdopen(fd, "w", encoding="utf-8") as f:\n            json.dump(data, f, indent=2)\n'
     '        os.replace(tmp, path)\n    except BaseException:\n        os.unlink(tmp)\n        raise\n',
     ''),
    ("Write a Python function `strip_comments(lines)` that returns the lines with everything from a \"#\" on "
     "removed, trailing spaces stripped, and lines that end up empty dropped.",
     'def strip_comments(lines):\n    result = []\n    for line in lines:\n'
     '        line = line.split("#", 1)[0].rstrip()\n        if line:\n            result.append(line)\n'
     '    return result\n',
     'assert strip_comments(["x = 1  # one", "# only", "", "y = 2"]) == ["x = 1", "y = 2"]\n'),
    ("Write a Python function `gcd(a, b)` that returns the greatest common divisor of two integers using "
     "Euclid's algorithm.",
     'def gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return abs(a)\n',
     'assert gcd(12, 18) == 6 and gcd(7, 0) == 7 and gcd(-4, 6) == 2\n'),
    ("Write a Python function `is_prime(n)` that returns True if the integer n is a prime number.",
     'def is_prime(n):\n    if n < 2:\n        return False\n    i = 2\n    while i * i <= n:\n'
     '        if n % i == 0:\n            return False\n        i += 1\n    return True\n',
     'assert [k for k in range(20) if is_prime(k)] == [2, 3, 5, 7, 11, 13, 17, 19]\n'),
    ("Write a Python function `binary_search(items, target)` that returns the index of `target` in the sorted "
     "list `items`, or -1 if it is not there.",
     'def binary_search(items, target):\n    low, high = 0, len(items) - 1\n    while low <= high:\n'
     '        mid = (low + high) // 2\n        if items[mid] == target:\n            return mid\n'
     '        if items[mid] < target:\n            low = mid + 1\n        else:\n            high = mid - 1\n'
     '    return -1\n',
     'assert binary_search([1, 3, 5, 7], 5) == 2 and binary_search([1, 3, 5, 7], 4) == -1\n'
     'assert binary_search([], 1) == -1\n'),
    ("Write a Python function `slugify(text)` that lower-cases `text`, replaces every run of characters other "
     "than a-z and 0-9 with a single hyphen, and strips hyphens from both ends.",
     'import re\n\n\ndef slugify(text):\n    text = re.sub(r"[^a-z0-9]+", "-", text.lower())\n'
     '    return text.strip("-")\n',
     'assert slugify("  Hello, World! 2024 ") == "hello-world-2024"\n'),
    ("Write a Python function `to_roman(n)` that converts a positive integer below 4000 to a Roman numeral.",
     'def to_roman(n):\n    values = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),\n'
     '              (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]\n'
     '    result = []\n    for value, letters in values:\n        count, n = divmod(n, value)\n'
     '        result.append(letters * count)\n    return "".join(result)\n',
     'assert to_roman(1994) == "MCMXCIV" and to_roman(4) == "IV" and to_roman(3999) == "MMMCMXCIX"\n'),
    ("Write a Python function `transpose(matrix)` that returns the transpose of a matrix given as a list of "
     "equal-length lists.",
     'def transpose(matrix):\n    return [list(row) for row in zip(*matrix)]\n',
     'assert transpose([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]]\n'),
    ("Write a Python function `most_common_words(text, k)` that returns the k most frequent lower-cased "
     "whitespace-separated words of `text`, most frequent first.",
     'from collections import Counter\n\n\ndef most_common_words(text, k):\n    words = text.lower().split()\n'
     '    return [word for word, _count in Counter(words).most_common(k)]\n',
     'assert most_common_words("b a B c b a", 2) == ["b", "a"]\n'),
    ("Write a Python function `run_length_encode(s)` that encodes runs of repeated characters as count "
     "followed by character, e.g. run_length_encode(\"aaabcc\") == \"3a1b2c\".",
     'def run_length_encode(s):\n    result = []\n    i = 0\n    while i < len(s):\n        j = i\n'
     '        while j < len(s) and s[j] == s[i]:\n            j += 1\n        result.append(f"{j - i}{s[i]}")\n'
     '        i = j\n    return "".join(result)\n',
     'assert run_length_encode("aaabcc") == "3a1b2c" and run_length_encode("") == ""\n'),
]

# ------------------------------------------------------------------------------------------ list-style questions
# Questions whose answer is a list of independent points (what Skeleton-of-Thought is for).
LIST_QUESTIONS: list[str] = [
    "What are the main benefits of regular exercise?",
    "What are the advantages of using version control for a software project?",
    "What are some tips for sleeping better?",
    "What are the main causes of climate change?",
    "What are good practices for writing readable Python code?",
    "What are the key differences between relational and document databases?",
    "What should I pack for a week-long hiking trip?",
    "What are the benefits of learning a second language?",
    "What are some ways to reduce stress at work?",
    "What makes a good CV?",
    "How should I prepare for a job interview?",
    "What are the advantages and disadvantages of working from home?",
    "What are effective ways to study for an exam?",
    "What are the main benefits of writing unit tests?",
    "What are some ways to save money on groceries?",
    "What should I check when buying a used car?",
    "What are the benefits of reading books regularly?",
    "How can I protect my online accounts from being hacked?",
    "What are the key principles of good user-interface design?",
    "How can I make a small apartment feel bigger?",
    "What are the health benefits of eating more vegetables?",
    "What are the common reasons a web page loads slowly?",
    "What are some tips for giving a good presentation?",
    "What are the benefits of code review?",
    "What are some good habits for managing personal finances?",
    "What are the main advantages of public transport in cities?",
    "How can I make a slow Python program faster?",
    "What should I check before deploying a web application to production?",
    "What are the benefits of composting at home?",
    "How can I stay productive when working from home?",
    "What are the key steps in planning a trip abroad?",
    "What are the benefits of keeping a journal?",
    "What mistakes do beginners often make when learning to program?",
    "What are the main advantages of electric cars?",
    "How can a team make a new member feel welcome?",
    "What are the benefits of using type hints in Python?",
]
