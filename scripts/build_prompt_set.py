"""Build batchspec's embedded prompt set: ``jobs/data/prompts.parquet``.

The prompt set is used by the default job and by the benchmarks that measure speculative
decoding acceptance per domain. All content below is authored by hand for this project (no
downloads); prompts are composed from authored building blocks (requests, word problems,
passages, questions) plus a few instruction templates that rotate deterministically.

Six domains, 60 prompts each: ``chat``, ``code``, ``math``, ``translation``,
``summarization`` and ``qa``. The language is kept clear and simple because the target model
is tiny (SmolLM2-135M-Instruct).

Columns written:

* ``id`` (string, unique, e.g. ``code-0007``)
* ``domain`` (string)
* ``prompt`` (string): the user request, self-contained
* ``messages`` (list<struct<role, content>>): the same request as an OpenAI-style chat; the
  last message is always the user turn holding ``prompt``. Some rows carry a system message,
  and about 10% are multi-turn (user / assistant / user) to exercise chat formatting.
* ``source`` (string): the pass-through tag ``authored-v1``.

The output is deterministic: there is no randomness and rows are sorted by ``id``, so running
the script twice gives byte-identical files (for the same pyarrow version).

Run from the repository root::

    python scripts/build_prompt_set.py            # writes jobs/data/prompts.parquet
    python scripts/build_prompt_set.py --out x.parquet

Requires only the standard library and pyarrow.
"""

from __future__ import annotations

import argparse
import statistics
import textwrap
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

SOURCE = "authored-v1"
PER_DOMAIN = 60
REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO_ROOT / "jobs" / "data" / "prompts.parquet"

Message = dict[str, str]


def _flat(text: str) -> str:
    """Collapse a wrapped, triple-quoted passage into a single line of prose."""
    return " ".join(text.split())


def _code(instruction: str, lang: str, snippet: str) -> str:
    """A request that embeds a fenced code snippet (keeps the snippet's indentation)."""
    body = textwrap.dedent(snippet).strip("\n")
    return f"{instruction}\n\n```{lang}\n{body}\n```"


# --------------------------------------------------------------------------------------------
# chat: emails, short stories, advice, poems, everyday writing
# --------------------------------------------------------------------------------------------

CHAT_PROMPTS: list[str] = [
    # emails
    "Write a short email to my manager asking for Friday afternoon off so I can attend my "
    "daughter's school play. Keep it polite and professional.",
    "Write a polite email to my neighbor asking them to keep their dog quiet in the early "
    "morning. I start work late and the barking wakes me up at 6 a.m.",
    "Write a thank-you email to a colleague named Priya who stayed late to help me finish a "
    "big sales report on time.",
    "Draft an email to my landlord reporting that the kitchen sink has been leaking for three "
    "days. Ask when a plumber can come.",
    "Write a friendly email inviting my team to a picnic in Central Park next Saturday at noon. "
    "Ask everyone to bring one dish to share.",
    "Write a short email to a customer apologizing that their order will arrive two days late "
    "because of a problem at our warehouse.",
    "Write an email to my professor asking for a one-week extension on my history essay "
    "because I was sick with the flu last week.",
    "Write a short cover letter email for a part-time job at a local bookstore. I love reading "
    "and I have worked in retail for two years.",
    "Write an email to a hotel asking whether they have a room for two people for two nights "
    "in early June, and whether breakfast is included.",
    "Write a short email reminding our book club members that this month's meeting has moved "
    "from Tuesday to Thursday at 7 p.m.",
    "Write a warm email to an old friend I have not talked to in a year. Ask how she is doing "
    "and suggest that we meet for coffee soon.",
    "Write a short resignation email to my boss. I am leaving to start a new job in two weeks, "
    "and I want to thank him for his support.",
    "Write an email to a plumber asking for a price quote to replace an old water heater in a "
    "small two-bedroom house.",
    "Write a welcome email for new members of our community garden. Mention the watering "
    "schedule and the monthly work day.",
    "Write a short email asking my coworker Daniel to review my presentation slides before "
    "Monday's meeting with the client.",
    # short stories
    "Write a short story about a kitchen robot who tries to bake bread for the first time and "
    "learns that patience matters.",
    "Write a short story for young children about a little turtle who wishes it could fly.",
    "Write a story of about 200 words about a lost key that opens a secret door in an old library.",
    "Tell a short bedtime story about a sleepy moon and a curious owl who cannot fall asleep.",
    "Write a short story about two friends who get lost while hiking and find their way home "
    "by following the stars.",
    "Write a short mystery story about a birthday cake that disappears from the kitchen just "
    "before the party starts.",
    'Write a short story that begins with this sentence: "The train stopped in the middle of '
    'a field, and nobody knew why."',
    "Write a funny short story about a cat who believes it is the mayor of a small town.",
    "Write a short story about an old fisherman who catches a fish that can talk.",
    "Write a short science fiction story about the first family to live in a house on Mars.",
    "Write a short story about a girl who finds an old map in her grandmother's attic and "
    "decides to follow it.",
    "Write a heartwarming short story about a dog who waits at a train station every evening "
    "for its owner.",
    # advice
    "I have a job interview tomorrow morning and I feel very nervous. What are some tips to "
    "stay calm and do well?",
    "How can I start a simple morning routine that helps me feel more awake and ready for the day?",
    "What are some easy ways to save money on groceries each week for a family of four?",
    "My roommate and I keep arguing about who should clean the kitchen. How can we solve this "
    "in a fair way?",
    "I want to start running, but I have never exercised regularly before. How should I begin?",
    "I just moved to a new city for work and I do not know anyone here. What are some good "
    "ways to make friends?",
    "How can I stop checking my phone so often while I study for my exams?",
    "Give me some simple tips for keeping houseplants alive. I always forget to water them.",
    "What should I pack for a three-day camping trip in the mountains in late summer?",
    "How can I get better sleep if I often wake up in the middle of the night and cannot fall "
    "asleep again?",
    "I need to give a five-minute speech at my best friend's wedding. How should I prepare for it?",
    "What are some simple and healthy lunches I can prepare the night before and bring to work?",
    # poems
    "Write a short poem about the first snow of winter falling on a quiet town.",
    "Write two haiku about a cup of morning coffee: one on a cold winter day and one on a warm "
    "summer morning.",
    "Write a short rhyming poem for my nephew's birthday card. He is turning seven and loves "
    "dinosaurs.",
    "Write a short poem about the ocean at night, with the moon shining on the waves.",
    "Write a four-line poem about autumn leaves falling in a park.",
    "Write a poem about my grandmother's kitchen and the smell of fresh bread on Sunday mornings.",
    "Write a short, cheerful poem about riding a bicycle through the countryside in spring.",
    "Write a poem about a big city waking up early in the morning.",
    "Write a funny limerick about a cat who loves cheese more than fish.",
    "Write a short poem to thank a teacher who helped me love reading.",
    # other everyday writing
    "Write a short toast for my parents' 30th wedding anniversary dinner. They met at a dance "
    "class in college.",
    "Write three catchy slogans for a small family bakery that sells fresh bread and pastries.",
    "Describe a cozy cafe on a rainy afternoon in four or five sentences.",
    "Write a short, friendly dialogue between a customer and a waiter at a pizza restaurant.",
    "Write a product description for a reusable steel water bottle that keeps drinks cold for "
    "24 hours.",
    "Tell me a few clean, friendly jokes that I can share with my coworkers at lunch.",
    "Write a short, funny birthday message for my older brother, who is turning 40.",
    "Write a short speech for a principal to welcome new students on their first day of school.",
    "Give me five fun ideas for a rainy weekend at home with two kids aged six and nine.",
    "Write a short note for a house sitter explaining how to feed my two cats, Milo and Luna, "
    "and where to find their food.",
    "Write a short online review of an Italian restaurant where the pasta was excellent but "
    "the service was slow.",
]

# --------------------------------------------------------------------------------------------
# code: write, modify, fix and explain code (Python, JavaScript, SQL, bash)
# --------------------------------------------------------------------------------------------

CODE_PROMPTS: list[str] = [
    # write: Python
    "Write a Python function that checks whether a string is a palindrome, ignoring spaces "
    "and capital letters.",
    "Write a Python function that returns the n-th Fibonacci number using a loop instead of "
    "recursion.",
    "Write a Python script that reads a CSV file named sales.csv and prints the total of the "
    '"amount" column.',
    "Write a Python function that counts how many times each word appears in a text and "
    "returns the counts as a dictionary.",
    "Write a Python class called BankAccount with deposit, withdraw, and get_balance methods. "
    "A withdrawal should not be allowed to make the balance negative.",
    "Write a Python function that merges two sorted lists of numbers into one sorted list "
    "without using sort().",
    "Write a Python function that removes duplicate items from a list while keeping the "
    "original order.",
    "Write a Python function that converts a temperature from Celsius to Fahrenheit, and show "
    "three example calls.",
    "Write a Python program that asks the user for a number and prints its multiplication "
    "table from 1 to 10.",
    "Write a Python function that finds the largest number in a list without using the "
    "built-in max function.",
    "Write a Python function is_prime(n) that returns True if n is a prime number and False "
    "otherwise.",
    "Write a Python script that lists all .txt files in a folder and prints the name and size "
    "in bytes of each one.",
    'Write a Python function that reads a JSON file and returns the value of the "name" key, '
    "or None if the key is missing.",
    "Write pytest tests for a Python function add(a, b) that returns the sum of two numbers. "
    "Include a test with negative numbers.",
    # write: JavaScript
    "Write a JavaScript function that reverses a string.",
    "Write a JavaScript function that takes an array of numbers and returns a new array with "
    "only the even numbers.",
    "Write a JavaScript function that fetches JSON from a URL using fetch and async/await, "
    "logs the result, and handles errors.",
    "Write a JavaScript function that capitalizes the first letter of every word in a sentence.",
    "Write a small HTML page with one button. When the button is clicked, show an alert that "
    'says "Hello!".',
    "Write a JavaScript debounce function that delays calling another function until a given "
    "number of milliseconds has passed without a new call.",
    "Write a JavaScript function that counts the vowels in a string.",
    # write: SQL
    "Write a SQL query that returns the ten most recent orders from a table named orders with "
    "columns id, customer_id, total, and created_at.",
    "Write a SQL query that shows the total sales per customer from a table "
    "orders(customer_id, total), sorted from highest to lowest.",
    "Write a SQL statement that creates a table named books with the columns id, title, "
    "author, and published_year. Make id the primary key.",
    "Write a SQL query that finds all employees whose salary is above the average salary. The "
    "table is employees(id, name, salary, department).",
    "Write a SQL query that joins customers(id, name) and orders(id, customer_id, total) and "
    "lists each customer's name with their number of orders, including customers with zero "
    "orders.",
    "Write a SQL query that counts how many users signed up in each month of 2023, using a "
    "table users(id, email, created_at).",
    # write: bash
    "Write a bash script that makes a backup copy of every .conf file in the current folder "
    "by adding .bak to the end of the file name.",
    "Write a bash one-liner that counts the total number of lines in all .py files in a "
    "project, including subfolders.",
    "Write a bash script that checks if a file named data.txt exists and prints a different "
    "message in each case.",
    'Write a bash script that loops over the numbers 1 to 5 and prints "Step N done" for each '
    "number.",
    "Write a bash command that finds all files larger than 100 MB in my home folder.",
    "Write a bash script that prints the current date, the disk usage of the root folder, and "
    "the amount of free memory.",
    # explain
    "Explain the difference between a list and a tuple in Python, and give a short example of "
    "each.",
    "Explain what a SQL JOIN does, using a simple example with a customers table and an orders "
    "table.",
    'Explain what "git rebase" does and when you might use it instead of "git merge".',
    "Explain the difference between == and === in JavaScript, with examples.",
    "What is recursion in programming? Explain it with a short Python example.",
    # snippets: fix, refactor, explain, convert
    _code(
        "Fix the bug in this Python function. It should return the average of a list of numbers.",
        "python",
        """
        def average(numbers):
            total = 0
            for n in numbers:
                total += n
            return total / len(numbers) - 1
        """,
    ),
    _code(
        "Refactor this Python code to use a list comprehension.",
        "python",
        """
        squares = []
        for i in range(10):
            if i % 2 == 0:
                squares.append(i * i)
        """,
    ),
    _code(
        "Explain what this Python code does, line by line.",
        "python",
        """
        from collections import Counter

        def top_words(text, k=3):
            words = text.lower().split()
            counts = Counter(words)
            return counts.most_common(k)
        """,
    ),
    _code(
        "This JavaScript function should return the sum of an array, but it gives the wrong "
        "answer. Find the bug and fix it.",
        "javascript",
        """
        function sum(arr) {
          let total = 0;
          for (let i = 1; i <= arr.length; i++) {
            total += arr[i];
          }
          return total;
        }
        """,
    ),
    _code(
        "Add type hints and a docstring to this Python function.",
        "python",
        """
        def find_user(users, user_id):
            for user in users:
                if user["id"] == user_id:
                    return user
            return None
        """,
    ),
    _code(
        "Rewrite this JavaScript code using const and arrow functions.",
        "javascript",
        """
        var numbers = [1, 2, 3, 4, 5];
        var doubled = numbers.map(function (n) {
          return n * 2;
        });
        var total = doubled.reduce(function (a, b) {
          return a + b;
        }, 0);
        console.log(total);
        """,
    ),
    _code(
        "Fix this SQL query. It should list the departments that have more than 5 employees.",
        "sql",
        """
        SELECT department, COUNT(*) AS n
        FROM employees
        WHERE COUNT(*) > 5
        GROUP BY department;
        """,
    ),
    _code(
        "This bash script breaks when a file name contains a space. Fix it.",
        "bash",
        """
        for f in $(ls *.jpg); do
          cp $f backup/$f
        done
        """,
    ),
    _code(
        "Refactor this Python function to make it shorter and easier to read.",
        "python",
        """
        def grade(score):
            if score >= 90:
                return "A"
            else:
                if score >= 80:
                    return "B"
                else:
                    if score >= 70:
                        return "C"
                    else:
                        return "F"
        """,
    ),
    _code(
        "Add error handling to this Python function so that it prints a friendly message if "
        "the file does not exist.",
        "python",
        """
        def read_config(path):
            with open(path) as f:
                return f.read()
        """,
    ),
    _code(
        "Convert this Python function to JavaScript.",
        "python",
        """
        def count_words(text):
            counts = {}
            for word in text.split():
                counts[word] = counts.get(word, 0) + 1
            return counts
        """,
    ),
    _code(
        "Explain why the second call in this Python code prints [1, 2] instead of [2], and "
        "show how to fix it.",
        "python",
        """
        def add_item(item, items=[]):
            items.append(item)
            return items

        print(add_item(1))
        print(add_item(2))
        """,
    ),
    _code(
        "Rename the variables in this Python function so that the names are clear. Keep the "
        "behavior the same.",
        "python",
        """
        def f(a, b):
            c = 0
            for d in a:
                if d > b:
                    c += 1
            return c
        """,
    ),
    _code(
        "Write unit tests with pytest for this Python function.",
        "python",
        """
        def is_even(n):
            return n % 2 == 0
        """,
    ),
    _code(
        "Explain in simple words what this SQL query returns.",
        "sql",
        """
        SELECT c.name, SUM(o.total) AS spent
        FROM customers c
        JOIN orders o ON o.customer_id = c.id
        WHERE o.created_at >= '2024-01-01'
        GROUP BY c.name
        HAVING SUM(o.total) > 1000
        ORDER BY spent DESC;
        """,
    ),
    _code(
        "Rewrite this JavaScript function to use async/await instead of .then().",
        "javascript",
        """
        function loadUser(id) {
          return fetch("/api/users/" + id)
            .then(function (res) {
              return res.json();
            })
            .then(function (user) {
              console.log(user.name);
              return user;
            });
        }
        """,
    ),
    _code(
        "This Python loop should print the numbers 1 to 10, but it stops at 9. Fix the "
        "off-by-one error.",
        "python",
        """
        for i in range(1, 10):
            print(i)
        """,
    ),
    _code(
        "Turn this Python script into a function called main() and add an "
        'if __name__ == "__main__": guard.',
        "python",
        """
        import sys

        name = sys.argv[1] if len(sys.argv) > 1 else "world"
        greeting = "Hello, " + name + "!"
        print(greeting)
        """,
    ),
    _code(
        "Explain what this bash script does.",
        "bash",
        """
        #!/bin/bash
        set -e
        for dir in */; do
          count=$(ls "$dir" | wc -l)
          echo "$dir has $count files"
        done
        """,
    ),
    _code(
        "Rewrite this Python code using f-strings.",
        "python",
        """
        name = "Ana"
        age = 31
        city = "Lisbon"
        print("My name is " + name + ", I am " + str(age) + " and I live in " + city + ".")
        """,
    ),
    _code(
        "Add a docstring and input checks to this Python function. It should raise a "
        "ValueError if the width or the height is negative.",
        "python",
        """
        def rectangle_area(width, height):
            return width * height
        """,
    ),
    _code(
        "Simplify this Python code by using the built-in sum() with a generator expression.",
        "python",
        """
        total = 0
        for item in cart:
            total = total + item["price"] * item["quantity"]
        """,
    ),
]

# --------------------------------------------------------------------------------------------
# math: grade-school word problems with concrete numbers
# --------------------------------------------------------------------------------------------

MATH_PROBLEMS: list[str] = [
    "Maria has 24 apples. She gives 7 to her brother and 5 to her friend. How many apples "
    "does she have left?",
    "A box holds 12 pencils. A teacher buys 8 boxes. How many pencils does she have in total?",
    "Tom reads 15 pages of his book every day. The book has 180 pages. How many days will it "
    "take him to finish the book?",
    "A bakery sells muffins for $3 each. On Monday it sold 46 muffins. How much money did the "
    "bakery make from muffins on Monday?",
    "There are 32 students in a class. The teacher splits them into groups of 4. How many "
    "groups are there?",
    "A train travels at 60 miles per hour. How far does it travel in 3.5 hours?",
    "Liam saved $45 in January, $60 in February, and $38 in March. How much did he save in total?",
    "A rectangular garden is 12 meters long and 7 meters wide. What is its area, and what is "
    "its perimeter?",
    "A shirt costs $40. It is on sale for 25% off. What is the sale price of the shirt?",
    "Emma buys 3 notebooks at $2.50 each and 2 pens at $1.25 each. She pays with a $20 bill. "
    "How much change does she get?",
    "A farmer has 9 rows of corn with 14 plants in each row. How many corn plants does he have?",
    "A movie starts at 6:45 PM and lasts 2 hours and 20 minutes. At what time does it end?",
    "Sam has 3 times as many marbles as Jake. Jake has 18 marbles. How many marbles do they "
    "have together?",
    "A recipe needs 2 cups of flour to make 12 cookies. How many cups of flour are needed to "
    "make 36 cookies?",
    "A school bus can carry 48 students. How many buses are needed to take 200 students on a "
    "field trip?",
    "A water tank holds 500 liters. It is 40% full. How many more liters are needed to fill it?",
    "Priya runs 4 kilometers on each weekday and 7 kilometers on both Saturday and Sunday. "
    "How many kilometers does she run in one week?",
    "A pizza is cut into 8 slices. Four friends each eat 3 slices. How many pizzas did they "
    "need to order, and how many slices are left over?",
    "The temperature was -4 degrees Celsius in the morning. By noon it had risen by 11 "
    "degrees. What was the temperature at noon?",
    "A store had 250 bottles of water. It sold 87 bottles on Saturday and 96 bottles on "
    "Sunday. How many bottles are left?",
    "Carlos earns $15 per hour. He works 6 hours a day, 5 days a week. How much does he earn "
    "in one week?",
    "A book costs $12 and a magazine costs $4. How much do 3 books and 5 magazines cost together?",
    "A car can drive 14 kilometers on 1 liter of fuel. How many liters does it need for a "
    "trip of 336 kilometers?",
    "Anna is 8 years older than her brother. In 5 years, the sum of their ages will be 40. "
    "How old is Anna now?",
    "A class collected 156 cans for a food drive over 4 weeks. They collected the same number "
    "of cans each week. How many cans did they collect per week?",
    "A phone plan costs $25 per month plus $0.10 for each text message. Last month Mia sent "
    "130 text messages. How much was her bill?",
    "A square has a perimeter of 36 centimeters. What is the area of the square?",
    "Jack had $80. He spent one quarter of it on a book and $18 on lunch. How much money does "
    "he have left?",
    "A library has 1,200 books. 35% of them are fiction. How many books are not fiction?",
    "Three friends share a restaurant bill of $87 equally. They also leave a $12 tip, which "
    "they split equally. How much does each person pay in total?",
    "A runner finishes one lap of the track in 90 seconds. How many minutes does it take her "
    "to run 6 laps at the same speed?",
    "A parking lot has 5 rows with 22 spaces in each row. There are 68 cars parked. How many "
    "spaces are empty?",
    "Lily plants 5 flowers every day for 2 weeks. Later, 12 of the flowers die. How many "
    "flowers are still alive?",
    "An aquarium has 3 times as many goldfish as angelfish. There are 48 fish in total. How "
    "many goldfish are there?",
    "A cyclist rides 18 km in the first hour, 15 km in the second hour, and 12 km in the "
    "third hour. What is her average speed?",
    "A box of 24 chocolates costs $9.60. How much does one chocolate cost?",
    "Noah wants a bike that costs $180. He already has $65 and saves $23 each week. How many "
    "weeks will it take until he can buy the bike?",
    "A rope is 15 meters long. It is cut into pieces that are each 1.5 meters long. How many "
    "pieces are there?",
    "A theater has 24 rows with 30 seats in each row. For one show, 612 tickets were sold. "
    "How many seats were empty?",
    "Olivia scored 85, 92, 78, and 89 on four tests. What is her average score?",
    "A jar contains 40 red, 25 blue, and 35 green marbles. What fraction of the marbles are "
    "blue? Write the fraction in simplest form.",
    "A shop buys a lamp for $30 and sells it for $45. What is the profit, and what percent of "
    "the cost price is the profit?",
    "A tree grows 35 centimeters each year. It is 2 meters tall now. How tall will it be in "
    "4 years? Give the answer in centimeters.",
    "Ben walks his dog for 25 minutes twice a day. How many hours does he spend walking his "
    "dog in one week?",
    "A family drives 240 km to visit their grandparents. They stop for lunch exactly halfway. "
    "After lunch they drive 50 km more. How many kilometers do they still have to drive?",
    "A pack of 6 juice boxes costs $4.20. How much do 30 juice boxes cost?",
    "A class has 14 boys and 16 girls. What percent of the class are girls? Round to one "
    "decimal place.",
    "One worker can pack 45 boxes in an hour. How many boxes can 4 workers pack in 7 hours?",
    "The price of a concert ticket went up from $20 to $26. By what percent did the price "
    "increase?",
    "Grace has 3 quarters, 6 dimes, and 9 nickels. How much money does she have in dollars?",
    "A farmer collects 18 eggs every day. He puts them in cartons that hold 12 eggs each. How "
    "many full cartons can he fill in one week?",
    "Two angles of a triangle are 47 degrees and 68 degrees. What is the size of the third angle?",
    "A market sells 3 oranges for $1. How much do 27 oranges cost?",
    "A swimming pool is 25 meters long. Ella swims 32 lengths of the pool. How many "
    "kilometers does she swim?",
    "A baker uses 250 grams of butter for each cake. How many kilograms of butter does he "
    "need to bake 18 cakes?",
    "A concert hall sold 420 adult tickets at $35 each and 180 child tickets at $20 each. "
    "What was the total money from ticket sales?",
    "Mark's phone battery is at 100% and drops by 12% every hour. After how many full hours "
    "will the battery be below 30%?",
    "A bag of rice weighs 5 kg. A family eats 350 grams of rice each day. For how many full "
    "days will the bag last?",
    "Two numbers add up to 56. One number is 10 more than the other. What are the two numbers?",
    "A printer prints 18 pages per minute. How long will it take to print 12 copies of a "
    "24-page report?",
]

MATH_INSTRUCTIONS: list[str] = [
    "{problem} Solve it step by step.",
    "Solve this word problem. Show your reasoning step by step, then give the final answer.\n\n"
    "{problem}",
    "{problem} Explain each step of your work and state the final answer at the end.",
    "Question: {problem}\nLet's think step by step.",
    "Help me solve this math problem step by step, so that I can understand how to do it:\n"
    "{problem}",
]

# --------------------------------------------------------------------------------------------
# translation: (source language, target language, 1-3 sentence source text)
# --------------------------------------------------------------------------------------------

ENGLISH_SOURCES: list[str] = [
    "The museum opens at nine in the morning and closes at six in the evening. Tickets are "
    "free for children under twelve.",
    "I would like to book a table for four people on Friday evening. Do you have anything "
    "available around eight o'clock?",
    "Water boils at 100 degrees Celsius at sea level. At higher altitudes, it boils at a "
    "lower temperature.",
    "Our company opened its first office in 2010. Today we have more than two hundred "
    "employees in five countries.",
    "Could you tell me where the nearest train station is? I need to catch the last train to "
    "the city.",
    "The library will be closed on Monday for repairs. We apologize for any inconvenience.",
    "My sister loves to paint landscapes. Every summer she travels to the mountains to find "
    "new ideas.",
    "Please remember to turn off the lights and lock the door when you leave the office.",
    "The Great Wall of China was built over many centuries. It was designed to protect the "
    "empire from invaders.",
    "Bees play an important role in nature. They carry pollen from flower to flower, which "
    "helps plants produce fruit.",
    "We are pleased to announce that sales increased by fifteen percent this quarter. Thank "
    "you all for your hard work.",
    "It rained all weekend, so we stayed at home, played board games, and made soup.",
    "The doctor said that I should drink more water and sleep at least eight hours every night.",
    "The meeting has been moved to Wednesday at ten o'clock. Please let me know if this time "
    "does not work for you.",
    "The Moon travels around the Earth about once every 27 days. Its gravity causes the tides "
    "in the oceans.",
    "I have been learning to cook for a year. My favorite dish is vegetable soup with fresh bread.",
    "The hotel is close to the beach and has a large swimming pool. Breakfast is served from "
    "seven to ten.",
    "Please send me the invoice by the end of the month. We will pay it within thirty days.",
    "The first printed books in Europe appeared in the fifteenth century. They made knowledge "
    "much easier to share.",
    "My train was forty minutes late, so I missed the beginning of the concert.",
    "Plants need sunlight, water, and air to grow. Without light, their leaves slowly turn yellow.",
    "The new park has a playground, a small lake, and many walking paths. It is very popular "
    "with families.",
    "Thank you for your order. Your package will be shipped tomorrow and should arrive within "
    "three days.",
    "When I was a child, I spent every summer on my grandparents' farm. Every morning I "
    "helped them feed the chickens.",
    "The city plans to build a new bridge over the river. Construction will start next spring.",
    "Excuse me, how much does this jacket cost? Do you have it in a smaller size?",
    "The human heart beats about one hundred thousand times a day. It pumps blood through the "
    "whole body.",
    "Our flight leaves at six in the morning, so we need to get up very early.",
    "The restaurant is closed on Sundays. On all other days it is open from noon until eleven "
    "at night.",
    "Many people now work from home. This saves time, but some people feel lonely without "
    "their colleagues.",
    "The price of coffee has risen this year because of poor harvests in several countries.",
    "I am sorry that I cannot come to your party on Saturday. I hope you have a wonderful time.",
    "Recycling paper and glass helps reduce waste. Most cities now have separate bins for "
    "each material.",
    "The castle was built in the twelfth century. Today it is a museum that welcomes "
    "thousands of visitors every year.",
    "Please read the instructions carefully before you use the machine for the first time.",
    "We walked along the river until sunset. Then we had dinner in a small restaurant near "
    "the old bridge.",
]

FRENCH_SOURCES: list[str] = [
    "Le marché du samedi matin est très animé. On y trouve des fruits, des légumes et du "
    "fromage de la région.",
    "Je voudrais réserver une chambre pour deux nuits. Est-ce que le petit déjeuner est compris ?",
    "La tour Eiffel a été construite pour l'Exposition universelle de 1889. Elle mesure "
    "environ trois cents mètres de haut.",
    "Nous avons déménagé à Lyon l'année dernière. Nos enfants aiment beaucoup leur nouvelle école.",
    "Le train pour Marseille partira avec vingt minutes de retard. Nous vous prions de nous "
    "excuser pour la gêne occasionnée.",
    "Il fait très beau aujourd'hui. Allons pique-niquer au bord du lac cet après-midi.",
    "L'entreprise a lancé un nouveau produit le mois dernier. Les premières ventes sont très "
    "encourageantes.",
    "Mon grand-père cultive des tomates et des haricots dans son jardin. Chaque été, il "
    "partage sa récolte avec les voisins.",
]

SPANISH_SOURCES: list[str] = [
    "La biblioteca abre de lunes a viernes de nueve a ocho. Los sábados cierra a las dos de "
    "la tarde.",
    "¿Podría decirme cómo llegar al museo? Creo que me he perdido.",
    "Mi hermano trabaja como enfermero en un hospital de Madrid. Le encanta ayudar a los "
    "pacientes.",
    "El año pasado viajamos a México y visitamos las pirámides de Teotihuacán. Fue una "
    "experiencia increíble.",
    "Las ventas de la empresa aumentaron un diez por ciento este año. El equipo celebró el "
    "resultado con una cena.",
    "Los delfines son animales muy inteligentes. Viven en grupos y se comunican con sonidos.",
    "Hoy hace mucho calor, así que vamos a ir a la playa después del almuerzo.",
    "Por favor, apague su teléfono móvil durante la película. Gracias por su comprensión.",
]

GERMAN_SOURCES: list[str] = [
    "Der Zug nach Berlin fährt um halb neun von Gleis drei ab. Bitte steigen Sie rechtzeitig ein.",
    "Ich lerne seit zwei Jahren Deutsch. Am liebsten lese ich Kinderbücher, weil die Sätze "
    "einfach sind.",
    "Im Winter liegt in den Alpen oft viel Schnee. Dann fahren viele Menschen dorthin, um Ski "
    "zu fahren.",
    "Unser Büro bleibt am Freitag geschlossen. Ab Montag sind wir wie gewohnt wieder für Sie da.",
    "Die Berliner Mauer fiel im Jahr 1989. Ein Jahr später wurde Deutschland wiedervereinigt.",
    "Könnten Sie mir bitte die Rechnung schicken? Ich möchte sie bis Ende der Woche bezahlen.",
    "Meine Großmutter backt jeden Sonntag einen Apfelkuchen. Dann kommt die ganze Familie "
    "zum Kaffee.",
    "Fahrradfahren ist gesund und gut für die Umwelt. In vielen Städten gibt es jetzt mehr "
    "Radwege.",
]

TRANSLATION_INSTRUCTIONS: list[str] = [
    "Translate the following text from {src} to {tgt}:\n\n{text}",
    'Please translate this {src} passage into {tgt}.\n\n"{text}"',
    "Translate into {tgt}:\n{text}",
    'How would you say this in {tgt}? "{text}"',
    "Translate the text below from {src} into natural {tgt}. Give only the translation.\n\n"
    "Text: {text}",
]


def _translation_items() -> list[tuple[str, str, str]]:
    """60 (source language, target language, text) triples: 36 from English, 24 into it."""
    targets = ("French", "Spanish", "German")
    items = [("English", targets[i % 3], text) for i, text in enumerate(ENGLISH_SOURCES)]
    for lang, texts in (
        ("French", FRENCH_SOURCES),
        ("Spanish", SPANISH_SOURCES),
        ("German", GERMAN_SOURCES),
    ):
        items.extend((lang, "English", text) for text in texts)
    return items


# --------------------------------------------------------------------------------------------
# summarization: authored passages of 80-200 words
# --------------------------------------------------------------------------------------------

SUMMARY_PASSAGES: list[str] = [
    """
    Plants make their own food through a process called photosynthesis. Inside their leaves
    are tiny structures called chloroplasts, which contain a green pigment named chlorophyll.
    Chlorophyll absorbs energy from sunlight. The plant uses this energy to combine water,
    taken up by its roots, with carbon dioxide, taken from the air through small openings in
    the leaves. The result is glucose, a simple sugar that the plant uses for energy and
    growth. Oxygen is released as a by-product, and this is the oxygen that humans and
    animals breathe. Photosynthesis is therefore important not only for plants but for almost
    all life on Earth. Scientists also study it closely because it removes carbon dioxide from
    the atmosphere, which helps slow climate change.
    """,
    """
    Around the year 1440, a German goldsmith named Johannes Gutenberg developed a printing
    press with movable metal type. Before this invention, most books in Europe were copied by
    hand, which was slow and expensive. A single Bible could take a scribe more than a year to
    finish. Gutenberg's press allowed workers to print hundreds of pages a day. Within fifty
    years, printing shops had spread to more than two hundred cities across Europe, and
    millions of books had been produced. Books became cheaper, and more people learned to
    read. Historians believe the printing press helped spread new ideas in science, religion,
    and politics, and that it played a major role in the Renaissance and the Reformation.
    """,
    """
    When Rosa Alvarez opened a small coffee shop in her neighborhood three years ago, she had
    only two employees and six tables. At first, business was slow, and she worried that she
    would have to close. Instead of spending money on advertising, she focused on getting to
    know her customers. She remembered their names and favorite drinks, and she started a
    weekly open-mic night for local musicians. Word spread quickly. Today the shop has twelve
    employees and is busy from morning until evening. Rosa says the biggest lesson she learned
    is that people come back not only for good coffee but for a place where they feel
    welcome. She now plans to open a second location next year.
    """,
    """
    Many adults do not get enough sleep. Doctors recommend seven to nine hours each night, but
    surveys show that about one in three adults sleeps less than seven hours. Lack of sleep
    can make it harder to concentrate, remember things, and control emotions. Over time, it is
    also linked to health problems such as heart disease, diabetes, and weight gain. Experts
    suggest a few simple habits to sleep better. Go to bed and wake up at the same time every
    day, even on weekends. Keep the bedroom dark, quiet, and cool. Avoid caffeine in the
    afternoon and large meals late at night. Finally, put away phones and screens at least
    thirty minutes before bed, because their light can keep the brain alert.
    """,
    """
    A volcano is an opening in the Earth's surface through which melted rock, gas, and ash
    escape. Deep underground, high temperatures melt rock into a thick liquid called magma.
    Because magma is lighter than the solid rock around it, it slowly rises and collects in
    chambers beneath the surface. When pressure builds up, the magma can burst out in an
    eruption. Once it reaches the surface, it is called lava. Some eruptions are gentle, with
    lava flowing slowly down the sides of the mountain, like many in Hawaii. Others are
    explosive and throw ash high into the sky, which can disrupt air travel and even cool the
    climate for a short time. Scientists monitor small earthquakes and gas levels to predict
    eruptions.
    """,
    """
    The ancient Romans built one of the greatest road networks in history. At its peak, the
    empire had more than 80,000 kilometers of paved roads connecting cities from Britain to
    the Middle East. Roman engineers built roads in layers: a base of large stones, then
    smaller stones and gravel, and finally flat paving stones on top. Roads were slightly
    curved so that rainwater would run off into ditches on the sides. These roads allowed
    armies to move quickly, but they also helped traders, messengers, and travelers.
    Milestones along the way told people how far they were from the next town. Some Roman
    roads are still used today, and many modern highways in Europe follow the same routes.
    """,
    """
    Over the past few years, many companies have allowed employees to work from home for part
    or all of the week. Supporters say remote work saves time and money on commuting and gives
    workers more flexibility to care for their families. Some studies have found that people
    working from home are just as productive as those in the office, or even more. However,
    remote work also has challenges. Some employees feel isolated and miss chatting with their
    colleagues. Managers sometimes find it harder to train new staff and build team spirit. As
    a result, many businesses now use a hybrid model, in which workers spend two or three days
    in the office and the rest of the week at home.
    """,
    """
    Last spring, residents of Maple Street turned an empty lot into a community garden. The
    city agreed to lend them the land for free, and a local hardware store donated tools and
    wood for raised beds. About thirty families signed up, and each received a small plot to
    grow vegetables, herbs, or flowers. Volunteers set up a schedule for watering and weeding
    the shared areas. By the end of the summer, the garden had produced hundreds of kilograms
    of tomatoes, beans, squash, and lettuce. Extra vegetables were given to a nearby food
    bank. Neighbors say the garden did more than grow food: it helped people who had lived
    near each other for years finally meet and become friends.
    """,
    """
    Honeybees live in large groups called colonies. A single colony can contain tens of
    thousands of bees, but only one queen. The queen's main job is to lay eggs, sometimes more
    than a thousand in a single day. Most of the other bees are female workers. Young workers
    clean the hive and feed the larvae, while older workers fly out to collect nectar and
    pollen from flowers. Male bees, called drones, do not collect food; their only role is to
    mate with a queen. When a worker finds a good source of food, she returns to the hive and
    performs a "waggle dance" that tells the other bees the direction and distance to the
    flowers.
    """,
    """
    On July 20, 1969, the American spacecraft Apollo 11 landed on the Moon. Astronauts Neil
    Armstrong and Buzz Aldrin became the first people to walk on its surface, while their
    teammate Michael Collins stayed in orbit in the command module. Armstrong stepped out
    first and said the famous words, "That's one small step for man, one giant leap for
    mankind." The two astronauts spent about two and a half hours outside, collecting rock
    samples, taking photographs, and setting up scientific experiments. About 600 million
    people around the world watched the event on television. The crew returned safely to
    Earth four days later, landing in the Pacific Ocean.
    """,
    """
    In the spring, a toy company in Ohio faced a serious problem. The factory that made its
    best-selling puzzle was located overseas, and a shipping delay meant that thousands of
    puzzles would arrive six weeks late. The company's managers had to decide quickly what to
    do. They contacted a smaller factory in the United States that could produce a limited
    number of puzzles at a higher cost. They also emailed customers to explain the delay and
    offered a ten percent discount on future orders. Although profits were lower that
    quarter, most customers stayed loyal. The company later decided to work with two
    suppliers instead of one, so that a single delay would not stop its business again.
    """,
    """
    At the age of fifty-two, Daniel decided to learn the piano. He had always wanted to play,
    but as a child his family could not afford lessons. He bought a used keyboard and found a
    teacher who gave lessons online. At first, his fingers felt stiff, and even simple songs
    seemed difficult. He practiced for twenty minutes every evening after dinner. After six
    months, he could play several easy pieces, and after a year he performed at a small
    concert organized by his teacher. Daniel says that learning as an adult requires
    patience, but it is also very rewarding. He encourages others not to think they are too
    old to start something new.
    """,
    """
    The water cycle describes how water moves around the Earth. It begins when the sun heats
    water in oceans, lakes, and rivers, turning some of it into water vapor. This process is
    called evaporation. Plants also release water vapor from their leaves. As the warm, moist
    air rises, it cools, and the vapor turns into tiny droplets that form clouds. This is
    called condensation. When the droplets join together and become heavy, they fall back to
    the ground as rain, snow, or hail, which is known as precipitation. Some of this water
    flows into rivers and back to the ocean, while some soaks into the ground and becomes
    groundwater. Then the cycle starts again.
    """,
    """
    The Great Fire of London began early on the morning of September 2, 1666, in a bakery on
    Pudding Lane. Strong winds and dry weather helped the flames spread quickly through the
    narrow streets, where most houses were made of wood. The fire burned for four days. It
    destroyed more than 13,000 houses, 87 churches, and the old St Paul's Cathedral. Only a
    small number of deaths were recorded, although historians think the real number may have
    been higher. After the fire, the city was rebuilt with wider streets and with buildings
    made of brick and stone. The architect Christopher Wren designed the new St Paul's
    Cathedral, which still stands today.
    """,
    """
    More and more companies are selling products through subscriptions instead of single
    purchases. Customers pay a fixed amount every month to receive items such as meal kits,
    razors, or software. For businesses, subscriptions provide a steady and predictable
    income, which makes planning easier. They also help companies build long-term
    relationships with customers and learn about their preferences. For customers,
    subscriptions can be convenient, because they do not have to remember to reorder.
    However, many people sign up for several services and then forget about them, paying for
    things they rarely use. Consumer groups advise people to review their subscriptions every
    few months and cancel the ones they no longer need.
    """,
    """
    Public libraries have changed a great deal in the last twenty years. They still lend
    books, but they now offer much more. Many libraries provide free internet access and
    computers for people who do not have them at home. Others lend unusual items such as
    tools, board games, musical instruments, and even cake pans. Libraries also run classes on
    topics like job searching, basic computer skills, and learning English. For children,
    there are reading programs and homework help after school. Librarians say their goal is to
    be a place where everyone in the community can learn and meet, no matter how much money
    they have. In many towns, the library is one of the busiest public buildings.
    """,
    """
    Vaccines help the body learn to fight diseases without getting seriously sick first. A
    vaccine contains a weakened or inactive form of a germ, or just a piece of it, such as a
    protein. When a person receives the vaccine, the immune system recognizes this material as
    foreign and produces antibodies against it. The immune system also creates memory cells.
    If the person is later exposed to the real germ, these memory cells recognize it quickly,
    and the body can fight it off before it causes serious illness. Vaccines have greatly
    reduced diseases such as measles, polio, and tetanus. Smallpox, which killed millions of
    people, was declared completely eliminated in 1980 after a worldwide vaccination campaign.
    """,
    """
    The Silk Road was a network of trade routes that connected China with Central Asia, the
    Middle East, and Europe for more than 1,500 years. It got its name from silk, a valuable
    Chinese fabric that was highly desired in Rome and other distant lands. However, merchants
    traded many other goods as well, including spices, tea, paper, glass, horses, and precious
    metals. Few traders traveled the whole route. Instead, goods passed from one merchant to
    another along the way, often through busy market cities such as Samarkand. The Silk Road
    also carried ideas, religions, languages, and inventions between cultures. Unfortunately,
    it also helped spread diseases, including the plague in the fourteenth century.
    """,
    """
    Online reviews have become one of the most important factors in how people choose
    products and services. Surveys suggest that most shoppers read reviews before buying
    something online or visiting a new restaurant. A business with many positive reviews can
    attract new customers without spending much on advertising. On the other hand, a few
    negative reviews can quickly hurt its reputation. Experts recommend that business owners
    respond to reviews politely, including the negative ones. Thanking customers for their
    feedback and offering to fix problems shows that the business cares. Some companies have
    been caught posting fake positive reviews, which is illegal in many countries and can lead
    to large fines.
    """,
    """
    Moving to a new home is often described as one of the most stressful events in life.
    There is a lot to organize: packing, hiring movers, changing addresses, and setting up
    electricity and internet. Planning ahead can make the process much easier. Start packing a
    few weeks early, beginning with items you rarely use, such as holiday decorations or old
    books. Label each box with its contents and the room where it belongs. Keep a separate bag
    with important documents, medicine, phone chargers, and a change of clothes for the first
    night. Moving is also a good time to give away or sell things you no longer need, which
    means fewer boxes to carry.
    """,
    """
    Plastic is cheap, light, and strong, which is why it is used in so many products. But
    these same qualities make it a serious environmental problem. Most plastic does not break
    down naturally; instead, it slowly breaks into smaller and smaller pieces called
    microplastics. Scientists have found microplastics in oceans, rivers, soil, and even in
    drinking water. Only a small share of all the plastic ever made has been recycled. One
    reason is that there are many different types of plastic, and they must be sorted before
    they can be recycled. Many countries are now trying to reduce plastic waste by banning
    single-use bags and straws and by encouraging reusable containers.
    """,
    """
    For most of history, women were not allowed to vote in elections. In the nineteenth and
    early twentieth centuries, women in many countries organized to demand this right. They
    held marches, gave speeches, wrote newspaper articles, and sent petitions to governments.
    New Zealand became the first self-governing country to give all women the right to vote in
    national elections, in 1893. Australia, Finland, and Norway followed in the early 1900s.
    In the United States, the Nineteenth Amendment to the Constitution gave women the vote in
    1920, and in the United Kingdom, women gained equal voting rights with men in 1928. The
    movement changed politics by giving half of the population a voice.
    """,
    """
    Last year, a software company with ninety employees tried a four-day work week for six
    months. Staff worked four days instead of five but received the same salary. Before the
    trial, managers worried that work would not get done. To prepare, teams shortened
    meetings, reduced unnecessary emails, and set clear weekly goals. At the end of the trial,
    the company found that productivity had stayed about the same, while sick days fell by
    almost a third. Employees reported less stress and said they had more time for family and
    hobbies. Some customers were concerned about slower replies on Fridays, so the company
    created a small rotating team to answer urgent questions. The four-day week is now
    permanent.
    """,
    """
    Cooking at home has many benefits compared with eating out. First, it is usually much
    cheaper. A meal for four people at a restaurant can cost as much as several days of
    groceries. Second, home cooking is often healthier, because you control how much salt,
    sugar, and oil goes into your food. Third, cooking together can be a fun activity for
    families and friends. Many people say they do not have time to cook, but simple meals like
    pasta with vegetables, omelets, or soups can be made in under thirty minutes. Planning
    meals for the week and shopping with a list can also save both time and money.
    """,
    """
    A black hole is a region in space where gravity is so strong that nothing, not even light,
    can escape from it. Most black holes form when a very large star runs out of fuel and
    collapses under its own weight. The boundary around a black hole is called the event
    horizon. Anything that crosses it cannot come back out. Because black holes do not give
    off light, scientists cannot see them directly. Instead, they study how black holes affect
    nearby stars and gas. In 2019, an international team of astronomers released the first
    image of a black hole's shadow, made by linking radio telescopes around the world. Most
    large galaxies, including our Milky Way, have a giant black hole at their center.
    """,
    """
    In 1876, Alexander Graham Bell received a patent for the telephone, a device that could
    send the human voice over electric wires. Bell had been working on ways to help deaf
    people communicate, and his experiments with sound led to the invention. On March 10,
    1876, he made the first successful call to his assistant, Thomas Watson, saying, "Mr.
    Watson, come here, I want to see you." At first, many people saw the telephone as a toy,
    but it spread quickly. By 1900, there were more than a million telephones in the United
    States. The invention changed business and daily life by allowing people to talk
    instantly across long distances.
    """,
    """
    Opening a food truck can be a cheaper way to start a restaurant business. A truck with
    kitchen equipment can cost far less than renting and decorating a traditional restaurant.
    Owners can also move to where the customers are, such as office areas at lunchtime,
    festivals, and sports events. However, running a food truck has its own challenges. Owners
    need special permits, and the rules about where they can park differ from city to city.
    The small kitchen limits the size of the menu, and bad weather can keep customers away.
    Successful food truck owners often use social media to tell their followers where they
    will be each day and to announce new dishes.
    """,
    """
    Volunteering is a way to help others while also benefiting yourself. People volunteer in
    many places, such as animal shelters, hospitals, schools, food banks, and parks. Research
    has found that regular volunteers often feel happier and less stressed, and some studies
    even link volunteering to better health in older adults. Volunteering is also a good way
    to meet new people and learn new skills, which can be useful when looking for a job.
    Experts suggest choosing an activity that matches your interests and schedule. Even a few
    hours each month can make a difference. Many organizations list their volunteer
    opportunities online, which makes it easy to find something nearby.
    """,
    """
    The outer layer of the Earth is broken into large pieces called tectonic plates. These
    plates move very slowly, only a few centimeters per year, about as fast as fingernails
    grow. Where two plates meet, they can push against each other, pull apart, or slide past
    one another. Sometimes the edges get stuck, and pressure builds up over many years. When
    the rock finally breaks and the plates suddenly move, energy is released as waves that
    shake the ground. This is an earthquake. Countries like Japan and Chile, which sit near
    plate boundaries, have strict building rules so that buildings can bend without breaking
    during strong shaking.
    """,
    """
    The Great Pyramid of Giza was built about 4,500 years ago for the Egyptian king Khufu. It
    was originally about 146 meters tall and remained the tallest human-made structure in the
    world for nearly 4,000 years. The pyramid contains more than two million stone blocks,
    some weighing several tons. For a long time, people believed that slaves built the
    pyramids. However, archaeologists have found the remains of workers' villages nearby, with
    bakeries and tombs, suggesting that the builders were paid workers who were respected for
    their skills. Researchers still debate exactly how the heavy blocks were moved and lifted,
    but most believe that ramps and sledges were used.
    """,
    """
    The price of chocolate has risen sharply in recent years. Most of the world's cocoa beans
    are grown in a few countries in West Africa, especially Ivory Coast and Ghana. Bad weather
    and plant diseases have reduced harvests there, which means less cocoa is available while
    demand remains high. As a result, the price of cocoa beans has increased several times
    over. Chocolate makers have responded in different ways. Some have raised prices, while
    others have made their chocolate bars smaller or used less cocoa in their recipes.
    Farmers, however, often do not benefit much from higher prices, because many of them sell
    their beans at fixed prices set months earlier.
    """,
    """
    Many parents worry about how much time their children spend looking at screens. Phones,
    tablets, computers, and televisions are now part of daily life, and children use them for
    school, games, and talking with friends. Doctors say that too much screen time can affect
    sleep, physical activity, and attention. They suggest that parents create a family media
    plan with clear rules, such as no screens during meals or in the hour before bed. It also
    helps to choose good-quality programs and to watch or play together sometimes. Perhaps
    most important, parents can set a good example by limiting their own screen use and
    spending time outdoors or reading with their children.
    """,
    """
    Octopuses are among the most intelligent animals in the ocean. They have large brains for
    their size, and about two thirds of their nerve cells are in their eight arms, which lets
    each arm sense and react on its own. In experiments, octopuses have learned to open jars,
    solve simple puzzles, and find their way through mazes. Some have even escaped from their
    tanks in aquariums. Octopuses are also masters of disguise. Special cells in their skin let
    them change color and texture in a fraction of a second, helping them hide from predators
    or sneak up on prey. Surprisingly, most octopuses live for only one or two years.
    """,
    """
    Marie Curie was a scientist born in Warsaw, Poland, in 1867. Because women could not
    attend university in Poland at that time, she moved to Paris to study physics and
    mathematics. There she met Pierre Curie, and together they studied radioactivity, a word
    she helped create. In 1898, they discovered two new elements, polonium and radium. In
    1903, Marie Curie became the first woman to win a Nobel Prize, sharing the physics prize
    with Pierre and Henri Becquerel. In 1911, she won a second Nobel Prize, this time in
    chemistry. She remains the only person to win Nobel Prizes in two different sciences. Her
    work led to new medical treatments, including the use of radiation against cancer.
    """,
    """
    Sales of electric cars have grown quickly over the past decade. In 2015, they made up
    less than one percent of new cars sold worldwide; by 2023, the share was close to one in
    five. Several factors explain this growth. Battery prices have fallen, making the cars
    more affordable. Many governments offer tax breaks or discounts to buyers. Car makers have
    also introduced more models, from small city cars to large trucks. Still, challenges
    remain. Electric cars often cost more to buy than gasoline cars, and in some areas there
    are not enough charging stations. Experts expect sales to keep rising as prices fall and
    charging networks grow.
    """,
    """
    Walking is one of the simplest and cheapest ways to stay healthy. It requires no special
    equipment except a comfortable pair of shoes, and it can be done almost anywhere. Health
    experts recommend at least 150 minutes of moderate activity per week, which is about
    thirty minutes of brisk walking on five days. Regular walking strengthens the heart, helps
    control weight, and improves mood. It can also lower the risk of diseases such as type 2
    diabetes. To make walking a habit, people can take the stairs instead of the elevator, get
    off the bus one stop early, or invite a friend for an evening walk.
    """,
    """
    Have you ever wondered why the sky is blue? Sunlight looks white, but it is actually made
    of all the colors of the rainbow. Each color travels as a wave with a different length.
    When sunlight enters the Earth's atmosphere, it hits tiny gas molecules in the air. These
    molecules scatter short blue waves much more strongly than long red waves. As a result,
    blue light is spread all across the sky, and that is the color we see when we look up. At
    sunrise and sunset, sunlight must travel through much more air to reach us. Most of the
    blue light is scattered away before it arrives, leaving the reds and oranges that color
    the evening sky.
    """,
    """
    The RMS Titanic was a British passenger ship that was described as "practically
    unsinkable." On April 10, 1912, it left Southampton, England, on its first voyage to New
    York. Four days later, late at night, it struck an iceberg in the North Atlantic Ocean.
    Water poured into several compartments, and less than three hours later the ship sank.
    More than 1,500 of the roughly 2,200 people on board died. One reason for the high death
    toll was that the ship carried lifeboats for only about half of the passengers and crew.
    After the disaster, new international rules required ships to carry enough lifeboats for
    everyone and to keep a radio watch at all times.
    """,
    """
    Many shops and restaurants offer loyalty programs to encourage customers to return. In a
    typical program, customers earn points each time they make a purchase, and they can
    exchange these points for discounts or free items. A coffee shop might give a free drink
    after ten purchases, while an airline might offer a free flight after many trips. For
    businesses, loyalty programs do more than keep customers coming back. They also collect
    useful data about what people buy and when, which helps companies plan their stock and
    marketing. Critics point out that some programs are designed so that rewards are hard to
    reach, and that customers should read the rules carefully.
    """,
    """
    Creating a monthly budget is one of the best ways to take control of your money. Start by
    writing down your income after taxes. Then list your fixed expenses, such as rent,
    utilities, insurance, and loan payments. Next, estimate your variable expenses, like
    groceries, transportation, and entertainment. Many financial advisers suggest the 50/30/20
    rule: spend about 50 percent of your income on needs, 30 percent on wants, and save 20
    percent. Track your spending for a few weeks to see where your money really goes; many
    people are surprised by how much they spend on small things like snacks and coffee.
    Review your budget each month and adjust it when your situation changes.
    """,
    """
    In 1928, the Scottish scientist Alexander Fleming returned from a holiday to find
    something strange in his laboratory. A dish of bacteria he had left out had become
    contaminated with mold, and around the mold, the bacteria had died. Fleming realized that
    the mold was producing a substance that could kill bacteria. He named it penicillin.
    However, it was difficult to produce in large amounts, and for more than ten years it was
    not widely used. During the Second World War, a team led by Howard Florey and Ernst Chain
    found ways to make penicillin in large quantities. It saved the lives of many soldiers and
    became the first widely used antibiotic.
    """,
    """
    The Olympic Games began in ancient Greece more than 2,700 years ago. They were held every
    four years in Olympia in honor of the god Zeus. At first there was only one event, a short
    running race, but later the games included wrestling, boxing, chariot racing, and the
    pentathlon. Only free Greek men could compete. The ancient games ended in the fourth
    century AD. In 1896, a Frenchman named Pierre de Coubertin helped bring the Olympics back,
    and the first modern Games were held in Athens. Women first competed in 1900. Today, the
    Summer and Winter Olympics each take place every four years and include athletes from
    more than 200 countries.
    """,
    """
    When large online stores began selling books at low prices, many people predicted the end
    of small bookshops. Indeed, thousands of independent bookstores closed in the early 2000s.
    But in recent years, many have made a comeback. Owners have found ways to offer what
    websites cannot. They host author readings, book clubs, and children's story hours. Staff
    members give personal recommendations based on a customer's tastes. Some stores have added
    small cafes or sell gifts and stationery. Many customers say they like supporting local
    businesses and enjoy discovering books by browsing the shelves. While independent
    bookstores still face strong competition, their number has grown again in several
    countries.
    """,
    """
    Households throw away a surprising amount of food. In many wealthy countries, the average
    family wastes about a third of the food it buys. This wastes money and also harms the
    environment, since growing, transporting, and disposing of food uses water, energy, and
    land. There are simple ways to waste less. Plan meals before shopping and buy only what
    you need. Store fruit and vegetables properly so they last longer. Learn the difference
    between "best before" dates, which are about quality, and "use by" dates, which are about
    safety. Leftovers can be frozen or turned into new dishes, such as soups, omelets, or
    fried rice.
    """,
    """
    All animals seem to need some kind of rest, but they sleep in very different ways. Lions
    and house cats can sleep for up to twenty hours a day, while giraffes sleep only about two
    hours, often in short naps while standing up. Dolphins have a special ability: they let
    one half of their brain sleep while the other half stays awake. This allows them to keep
    swimming and come up to breathe. Some birds do something similar, sleeping with one eye
    open to watch for danger. Scientists are still studying why sleep is so important. It
    appears to help the brain store memories, repair the body, and save energy.
    """,
    """
    After the Second World War, Germany was divided into two countries: West Germany and East
    Germany. The city of Berlin, located inside East Germany, was also divided. In August
    1961, the East German government built a wall to stop its citizens from escaping to the
    West. The Berlin Wall separated families and friends for almost thirty years. Guards
    watched it day and night, and many people died trying to cross it. In 1989, after large
    peaceful protests in East Germany, the government announced on November 9 that people
    could cross the border freely. Crowds gathered at the wall and began to break it apart.
    Less than a year later, Germany was reunited.
    """,
    """
    For many teenagers, a first part-time job is an important step toward independence.
    Common first jobs include working in a supermarket, a restaurant, or a movie theater, or
    babysitting and walking dogs for neighbors. Besides earning money, young workers learn
    useful skills such as being on time, talking with customers, and working as part of a
    team. These experiences can also help them decide what they want to study or do in the
    future. However, teachers warn that working too many hours can hurt school grades. Many
    experts suggest that students who are still in school work no more than about fifteen
    hours a week.
    """,
    """
    You do not need a big garden to grow your own food. Many vegetables and herbs grow well in
    pots on a balcony or a sunny windowsill. Good choices for beginners include cherry
    tomatoes, lettuce, chili peppers, basil, mint, and parsley. Most of these plants need at
    least six hours of sunlight a day. Use containers with holes at the bottom so that extra
    water can drain away, and fill them with good potting soil rather than soil from the
    garden. Water the plants when the top of the soil feels dry. In hot summer weather, this
    may be every day. With a little care, even a small balcony can provide fresh salads all
    summer.
    """,
    """
    Coral reefs cover less than one percent of the ocean floor, but they are home to about a
    quarter of all marine species. Reefs are built by tiny animals called coral polyps, which
    create hard skeletons of limestone. Over thousands of years, these skeletons pile up to
    form large structures. Many corals live in a close partnership with tiny algae that live
    inside them. The algae produce food through photosynthesis and give corals their bright
    colors. When ocean water becomes too warm, corals push out the algae and turn white, which
    is called bleaching. If the water does not cool down soon, the corals can die. Scientists
    warn that rising ocean temperatures are a major threat to reefs.
    """,
    """
    The bicycle has a surprisingly long history. One of the first versions, built in Germany
    in 1817 by Karl Drais, had no pedals; riders pushed it along with their feet. In the
    1860s, pedals were added to the front wheel. Later, the "penny-farthing" became popular,
    with a huge front wheel and a tiny back wheel, but it was dangerous and hard to ride. In
    the 1880s, the "safety bicycle" appeared, with two wheels of equal size and a chain that
    turned the back wheel. This design is similar to the bicycles we ride today. Bicycles gave
    ordinary people, including many women, a new freedom to travel on their own.
    """,
    """
    Social media has become an important tool for small businesses. Platforms like Instagram
    and Facebook allow a bakery, a hair salon, or a repair shop to reach thousands of people
    for little or no cost. Businesses can share photos of their products, announce special
    offers, and answer customer questions directly. Posting regularly helps keep a business in
    people's minds. However, social media also takes time, and many owners find it hard to
    keep up while running their shops. Experts recommend focusing on one or two platforms
    where customers are most active, rather than trying to be everywhere. Short videos and
    behind-the-scenes photos often get the most attention.
    """,
    """
    Every home should have a basic first aid kit, and it is a good idea to keep one in the car
    as well. A simple kit should include bandages of different sizes, sterile gauze pads,
    adhesive tape, scissors, tweezers, and antiseptic wipes. It is also useful to add a
    thermometer, disposable gloves, pain relief tablets, and an instant cold pack. Keep the
    kit in a place that is easy to reach, and make sure everyone in the family knows where it
    is. Check it every few months to replace anything that has been used or has expired.
    Taking a short first aid course can also give you the confidence to act quickly in an
    emergency.
    """,
    """
    Bats are the only mammals that can truly fly, and many of them find their way in the dark
    using a skill called echolocation. While flying, a bat makes high-pitched sounds, usually
    too high for humans to hear. These sounds travel through the air and bounce off objects,
    such as trees, walls, or insects. The bat listens to the returning echoes. From the time
    it takes for an echo to come back and how it sounds, the bat can tell how far away an
    object is, how big it is, and even which direction it is moving. This allows bats to catch
    tiny insects in complete darkness. Dolphins and some whales use a similar method
    underwater.
    """,
    """
    In 1215, a group of powerful English barons were angry with King John. He had raised taxes
    heavily, lost wars in France, and often punished people without fair trials. The barons
    rebelled and forced the king to meet them at Runnymede, a meadow near the River Thames.
    There, on June 15, King John agreed to a document known as the Magna Carta, which means
    "Great Charter" in Latin. It said that the king had to follow the law like everyone else
    and that free men could not be imprisoned without a lawful judgment. The king soon broke
    his promises, but the Magna Carta became an important symbol of the idea that rulers are
    not above the law.
    """,
    """
    Inflation means that prices for goods and services rise over time, so the same amount of
    money buys less than before. For example, if inflation is three percent a year, a basket
    of groceries that costs 100 dollars today will cost about 103 dollars next year. A small,
    steady amount of inflation is considered normal in a healthy economy. Problems begin when
    prices rise too fast, because people's wages and savings may not keep up. To control
    inflation, central banks often raise interest rates. This makes borrowing more expensive,
    which slows down spending and can help bring prices back under control. However, raising
    rates too much can also slow economic growth.
    """,
    """
    Adopting a pet from an animal shelter can bring a lot of joy, but it is also a big
    responsibility. Before choosing an animal, think about your daily schedule, your home, and
    your budget. Dogs need regular walks, training, and attention, while cats are often more
    independent but still need play and care. Small animals such as rabbits and guinea pigs
    have their own special needs. Remember that pets can live for many years, and costs for
    food, vet visits, and supplies add up. Shelter staff can help you find an animal whose
    energy level and personality match your lifestyle. Many shelters also let you foster a pet
    for a short time before deciding.
    """,
    """
    Scientists often divide human memory into different types. Short-term memory holds small
    amounts of information for a few seconds or minutes, such as a phone number you are about
    to dial. Most people can keep about five to nine items in short-term memory at once.
    Long-term memory can store huge amounts of information for years. It includes facts, like
    the capital of France, and skills, like riding a bike. To move information from short-term
    to long-term memory, repetition and meaning help a lot. Sleep also plays an important
    role. Studies show that people remember new information better after a good night's
    sleep, because the brain strengthens memories while we rest.
    """,
    """
    The first transcontinental railroad in the United States was completed on May 10, 1869.
    Two companies built it from opposite directions. The Central Pacific started in
    Sacramento, California, and worked east through the steep Sierra Nevada mountains, while
    the Union Pacific started in Omaha, Nebraska, and worked west across the plains. Thousands
    of workers, including many Chinese and Irish immigrants, did the hard and dangerous labor.
    The two lines met at Promontory Summit in Utah, where a golden spike was hammered into the
    final tie. The railroad cut the journey across the country from several months to about a
    week, helping trade and settlement in the West.
    """,
    """
    Many new companies fail because they spend a long time building a product that nobody
    wants. To avoid this, some entrepreneurs follow an approach known as the "lean startup."
    Instead of creating a perfect product from the start, they build a simple early version
    with only the most important features. They then share it with real customers and collect
    feedback. Based on what they learn, they improve the product step by step, or change
    direction if the idea is not working. This method helps save time and money. For example,
    a team planning a meal delivery app might first take orders by phone for a few weeks to
    see if people are really interested.
    """,
    """
    Every year, many families decide whether to live in a city or in the countryside. Cities
    offer more jobs, public transport, shops, restaurants, and cultural activities such as
    theaters and museums. Hospitals and universities are usually closer. However, city life
    can be noisy and crowded, and housing is often expensive. The countryside offers fresh
    air, quiet surroundings, and more space for the money. Many people enjoy being close to
    nature and knowing their neighbors. On the other hand, residents often need a car, and
    services like doctors and schools may be far away. Since remote work has become more
    common, more people are moving to smaller towns while keeping their city jobs.
    """,
]

SUMMARY_INSTRUCTIONS: list[str] = [
    "Summarize the following passage in two or three sentences.\n\n{passage}",
    "Read the text below and write a short summary of it.\n\nText:\n{passage}",
    "Give a one-paragraph summary of this article:\n\n{passage}",
    "Summarize the main points of this passage as a short bulleted list.\n\n{passage}",
    "Write a one-sentence summary of the following text.\n\n{passage}",
    "Here is a passage:\n\n{passage}\n\nSummarize it in simple words for a young reader.",
    "{passage}\n\nTL;DR: summarize the text above in about 40 words.",
]

# --------------------------------------------------------------------------------------------
# qa: context passages of 60-150 words, two extractive questions each
# --------------------------------------------------------------------------------------------

QA_ITEMS: list[tuple[str, tuple[str, str]]] = [
    (
        """
        Greenfield Electronics accepts returns within 30 days of purchase. Items must be in
        their original packaging and come with the receipt. Opened software, video games, and
        headphones cannot be returned, but they may be exchanged for the same item if they are
        faulty. Refunds are given in the original form of payment. Customers who bought items
        online may return them by mail using a free return label, or bring them to any
        Greenfield store. Refunds for mail returns are processed within 7 business days after
        the package arrives. During the holiday season, items bought between November 15 and
        December 24 can be returned until January 31.
        """,
        (
            "How many days does a customer normally have to return an item?",
            "Until what date can an item bought on December 10 be returned?",
        ),
    ),
    (
        """
        Mount Everest is the highest mountain on Earth above sea level, with a height of 8,849
        meters. It lies in the Himalayas on the border between Nepal and the Tibet region of
        China. The mountain is named after George Everest, a British surveyor, although local
        people have long called it Sagarmatha in Nepal and Chomolungma in Tibet. The first
        confirmed climbers to reach the summit were Edmund Hillary from New Zealand and Tenzing
        Norgay, a Sherpa from Nepal, on May 29, 1953. Today, hundreds of people try to climb
        Everest each year, mostly in May, when the weather is usually calmest.
        """,
        (
            "Who were the first confirmed climbers to reach the top of Mount Everest?",
            "In which month do most people try to climb Everest, and why?",
        ),
    ),
    (
        """
        Starting on March 4, the Riverside office will move from the third floor to the fifth
        floor of the same building. The move will take place over the weekend, so no work time
        will be lost. Employees should pack their desks into the labeled boxes by 5 p.m. on
        Friday, March 1. The IT team will move all computers and phones. On Monday, the new
        kitchen will be ready, and the large meeting room, called the Lake Room, can be booked
        through the usual calendar system. Parking passes will not change. Questions about the
        move should be sent to Helen Park in the facilities team.
        """,
        (
            "By what time and date must employees pack their desks?",
            "Who should employees contact if they have questions about the move?",
        ),
    ),
    (
        """
        The giant panda lives in the mountain forests of central China. Although it belongs to
        the bear family, its diet is almost entirely bamboo. Because bamboo provides little
        energy, an adult panda must eat for 10 to 16 hours a day, eating up to 38 kilograms of
        bamboo. Pandas have a special bone in their wrist that works like a thumb, helping them
        hold the bamboo stalks. Wild pandas mostly live alone. A female usually gives birth to
        one or two cubs, which weigh only about 100 grams at birth. Thanks to conservation
        work, the panda's status was changed from endangered to vulnerable in 2016.
        """,
        (
            "How much bamboo can an adult panda eat in one day?",
            "In what year was the panda's status changed from endangered to vulnerable?",
        ),
    ),
    (
        """
        To make about twelve pancakes, mix 200 grams of flour, two teaspoons of baking powder,
        one tablespoon of sugar, and a pinch of salt in a large bowl. In another bowl, whisk
        together two eggs, 300 milliliters of milk, and 30 grams of melted butter. Pour the wet
        ingredients into the dry ones and stir gently until just combined; a few small lumps
        are fine. Let the batter rest for five minutes. Heat a lightly oiled pan over medium
        heat and pour in about a quarter cup of batter for each pancake. Flip the pancake when
        bubbles appear on the surface, then cook it for one more minute.
        """,
        (
            "How long should the batter rest before cooking?",
            "When should you flip a pancake?",
        ),
    ),
    (
        """
        Ada Lovelace was an English mathematician born in 1815. She was the daughter of the
        famous poet Lord Byron, but she was raised by her mother, who encouraged her to study
        mathematics and science. In 1833, Ada met Charles Babbage, who was designing a
        mechanical calculating machine called the Analytical Engine. Ada translated an article
        about the machine from French into English and added long notes of her own. In these
        notes, she described a method for the machine to calculate a series of numbers called
        Bernoulli numbers. Because of this, many people consider her the first computer
        programmer. She died in 1852 at the age of 36.
        """,
        (
            "Who was designing the Analytical Engine?",
            "Why do many people consider Ada Lovelace the first computer programmer?",
        ),
    ),
    (
        """
        Because of track repairs, there will be changes to the Northern Line service from
        Saturday, June 8 to Sunday, June 16. During this period, trains will not run between
        Hillcrest and Old Harbor stations. Free replacement buses will run every 15 minutes
        between these two stations, stopping outside each station's main entrance. Travelers
        should allow an extra 30 minutes for their journey. Trains on the rest of the line will
        run as normal, although the last train from Central Station will leave at 11:00 p.m.
        instead of midnight. Tickets and passes will be accepted on the replacement buses.
        """,
        (
            "How often will the replacement buses run?",
            "What time will the last train leave Central Station during the repairs?",
        ),
    ),
    (
        """
        The Amazon River in South America is the largest river in the world by the amount of
        water it carries. It flows about 6,400 kilometers from the Andes Mountains in Peru to
        the Atlantic Ocean in Brazil. During the rainy season, the river can be more than 40
        kilometers wide in some places. The Amazon carries more water than the next seven
        largest rivers combined, and about one fifth of all the fresh water that flows into the
        world's oceans comes from it. The river is surrounded by the Amazon rainforest, which
        is home to millions of species of insects, plants, birds, and other animals.
        """,
        (
            "Where does the Amazon River begin, and where does it end?",
            "What share of the fresh water flowing into the world's oceans comes from the Amazon?",
        ),
    ),
    (
        """
        Members of the Sunrise Fitness Center can choose from three plans. The Basic plan costs
        $25 per month and includes access to the gym from 6 a.m. to 10 p.m. The Plus plan costs
        $40 per month and adds unlimited group classes, such as yoga, spinning, and dance. The
        Premium plan costs $60 per month and includes everything in Plus, as well as 24-hour
        access, use of the swimming pool, and one personal training session each month. All
        plans require a one-time sign-up fee of $20. Students with a valid ID receive a 15
        percent discount on any plan.
        """,
        (
            "Which plan includes use of the swimming pool?",
            "How much does the Plus plan cost per month, and what does it add to the Basic plan?",
        ),
    ),
    (
        """
        Leonardo da Vinci was born in 1452 in the small town of Vinci, near Florence, Italy. He
        is best known as a painter, and his works include the Mona Lisa and The Last Supper.
        However, Leonardo was also deeply interested in science and engineering. He filled
        thousands of notebook pages with drawings of machines, birds, the human body, and
        rivers. He designed flying machines, bridges, and weapons, although most of them were
        never built. He often wrote his notes in mirror writing, from right to left. Leonardo
        spent the last years of his life in France, where he died in 1519.
        """,
        (
            "Where was Leonardo da Vinci born?",
            "How did Leonardo often write his notes?",
        ),
    ),
    (
        """
        Lincoln Elementary School will hold its annual science fair on Thursday, April 18, in
        the school gym. Students in grades three to five may enter a project, either alone or
        with one partner. Projects must be registered with a classroom teacher by Friday, April
        5. Each project should include a poster that explains the question, the experiment, and
        the results. Judging will take place from 9 a.m. to noon, and families are invited to
        view the projects from 1 p.m. to 3 p.m. Prizes will be given for first, second, and
        third place in each grade, and every participant will receive a certificate.
        """,
        (
            "Which grades can enter a project in the science fair?",
            "When can families come to see the projects?",
        ),
    ),
    (
        """
        Kangaroos are marsupials that live only in Australia and nearby islands. Like other
        marsupials, female kangaroos carry their young in a pouch. A newborn kangaroo, called a
        joey, is about the size of a grape. It crawls into its mother's pouch, where it drinks
        milk and grows for about six months before it starts to look outside. Kangaroos move by
        hopping on their strong back legs and use their long tails for balance. The largest
        species, the red kangaroo, can hop at speeds of over 50 kilometers per hour and cover
        up to 8 meters in a single jump.
        """,
        (
            "What is a baby kangaroo called?",
            "How fast can a red kangaroo hop?",
        ),
    ),
    (
        """
        The SmartBrew coffee maker comes with a two-year limited warranty from the date of
        purchase. The warranty covers defects in materials and workmanship under normal home
        use. It does not cover damage caused by accidents, dropping the machine, using it with
        the wrong voltage, or failing to remove mineral buildup as described in the cleaning
        instructions. The glass carafe is covered for only 90 days. To make a claim, contact
        customer service with your proof of purchase and the serial number, which is printed on
        the bottom of the machine. If the product is found to be defective, SmartBrew will
        repair or replace it free of charge.
        """,
        (
            "How long is the glass carafe covered by the warranty?",
            "Where can you find the serial number of the coffee maker?",
        ),
    ),
    (
        """
        For thousands of years, life in ancient Egypt depended on the Nile River. Every summer,
        heavy rains in the highlands of Ethiopia caused the river to flood. When the water went
        down in the autumn, it left behind a layer of dark, rich soil along the riverbanks.
        Egyptian farmers planted wheat and barley in this soil and harvested their crops in the
        spring. The Egyptians divided their year into three seasons based on the river: the
        flood, the growing season, and the harvest. Because the land away from the river was
        desert, most people lived in a narrow green strip along the Nile.
        """,
        (
            "What caused the Nile to flood every summer?",
            "What were the three seasons of the ancient Egyptian year?",
        ),
    ),
    (
        """
        You are invited to the Oakwood Neighborhood Summer Party on Saturday, July 13, from 4
        p.m. to 9 p.m. at Oakwood Park, next to the tennis courts. There will be a barbecue,
        live music by the local band The Porch Lights, and games for children, including a
        bouncy castle and face painting. Food and drinks are free for residents, but guests are
        asked to bring a side dish or dessert to share. If it rains, the party will move to the
        community center on Elm Road. Please tell Karen Liu by July 6 how many people in your
        household will attend.
        """,
        (
            "Where will the party be held if it rains?",
            "What are guests asked to bring to the party?",
        ),
    ),
    (
        """
        Jupiter is the largest planet in our solar system. It is so big that more than 1,300
        Earths could fit inside it. Jupiter is a gas giant, made mostly of hydrogen and helium,
        and it does not have a solid surface. Its most famous feature is the Great Red Spot, a
        giant storm larger than Earth that has been raging for at least 350 years. Jupiter has
        at least 95 known moons. The four largest, called Io, Europa, Ganymede, and Callisto,
        were discovered by Galileo Galilei in 1610. Ganymede is the largest moon in the solar
        system, even bigger than the planet Mercury.
        """,
        (
            "What is the Great Red Spot?",
            "Which moon is the largest in the solar system?",
        ),
    ),
    (
        """
        Harbor City Animal Shelter is looking for a part-time animal care assistant. The
        assistant will feed and walk dogs, clean cages, and help visitors meet animals that are
        available for adoption. The position is 20 hours per week, including every other
        weekend. Applicants must be at least 18 years old and able to lift 20 kilograms.
        Previous experience with animals is helpful but not required, as full training will be
        provided. The pay is $17 per hour. To apply, send a short letter and a resume to the
        shelter's office before October 15. Interviews will take place during the last week of
        October.
        """,
        (
            "How many hours per week is the position?",
            "What is the deadline to apply for the job?",
        ),
    ),
    (
        """
        Tea has been drunk in China for thousands of years. According to a popular legend, the
        emperor Shen Nong discovered it in 2737 BC when leaves from a wild tea plant blew into
        his pot of boiling water. Tea became an everyday drink in China during the Tang
        dynasty, between the seventh and tenth centuries. Buddhist monks brought tea seeds to
        Japan, where a special tea ceremony developed. Tea reached Europe in the early 1600s
        through Dutch traders. In Britain it became very popular in the 1700s, and the custom
        of afternoon tea began in the 1840s with Anna, the Duchess of Bedford.
        """,
        (
            "According to the legend, who discovered tea?",
            "Who started the custom of afternoon tea in Britain?",
        ),
    ),
    (
        """
        Members of the Westbrook Public Library can borrow up to 15 items at a time. Books and
        audiobooks may be kept for three weeks, while DVDs and video games must be returned
        after one week. Items can be renewed twice online or by phone, unless another member
        has placed a hold on them. There is no fine for late children's books. For adult
        items, the late fee is 25 cents per day, up to a maximum of $5 per item. Lost or
        damaged items must be paid for at their replacement cost. A library card is free for
        anyone who lives, works, or studies in Westbrook.
        """,
        (
            "How long can DVDs be borrowed?",
            "What is the maximum late fee for one adult item?",
        ),
    ),
    (
        """
        An adult human skeleton has 206 bones, but babies are born with around 270. As
        children grow, some of these bones join together, for example in the skull and at the
        base of the spine. The smallest bone in the body is the stapes, found in the middle
        ear; it is only about 3 millimeters long. The longest and strongest bone is the femur,
        or thigh bone. Bones are living tissue: they are constantly being broken down and
        rebuilt. To keep bones strong, people need calcium and vitamin D in their diet, as well
        as regular exercise such as walking or running.
        """,
        (
            "How many bones does an adult human have?",
            "What is the smallest bone in the human body, and where is it found?",
        ),
    ),
    (
        """
        Bright Bikes was founded in 2012 by two friends, Omar Haddad and Julia Stein, in a
        small garage in Portland. At first they repaired used bicycles and sold them to
        students. In 2015, they designed their first folding bike, which could be carried onto
        buses and trains. It sold out within three months. The company now has 140 employees
        and sells its bikes in 18 countries. In 2022, Bright Bikes opened a factory that runs
        completely on solar power. The founders say their goal is to make cycling easy for
        people who live in small apartments and travel to work by public transport.
        """,
        (
            "Who founded Bright Bikes?",
            "What was special about the company's first folding bike?",
        ),
    ),
    (
        """
        Chess is a board game for two players that is played on a square board with 64 squares
        arranged in an eight-by-eight grid. Each player starts with 16 pieces: one king, one
        queen, two rooks, two bishops, two knights, and eight pawns. The player with the white
        pieces always moves first. The goal of the game is to checkmate the opponent's king,
        which means the king is under attack and has no legal way to escape. A game can also
        end in a draw, for example if neither player has enough pieces left to checkmate.
        Modern chess developed in southern Europe in the fifteenth century.
        """,
        (
            "How many pieces does each player have at the start of a chess game?",
            "Which player always moves first in chess?",
        ),
    ),
    (
        """
        Dear residents, please note that the water supply to Buildings A and B will be shut off
        on Tuesday, September 10, from 9 a.m. to 2 p.m., while plumbers replace an old main
        pipe. Building C will not be affected. We recommend filling a few bottles or a pot with
        water before 9 a.m. for drinking and cooking. After the water is turned back on, it may
        look cloudy or brown for a few minutes; simply let the cold tap run until the water is
        clear. We apologize for the inconvenience. If you have any questions, please call the
        building office.
        """,
        (
            "Which buildings will be affected by the water shut-off?",
            "What should residents do if the water looks brown after it is turned back on?",
        ),
    ),
    (
        """
        Every autumn, millions of monarch butterflies in Canada and the eastern United States
        begin an amazing journey. They fly south as far as 4,000 kilometers to spend the winter
        in the mountain forests of central Mexico. There they gather in huge groups on fir
        trees, sometimes so many that the branches bend under their weight. In spring, they
        start flying north again. However, no single butterfly completes the whole round trip.
        The butterflies that return north lay eggs along the way, and it takes three or four
        generations to reach Canada again. Scientists believe monarchs use the position of the
        sun to find their way.
        """,
        (
            "Where do these monarch butterflies spend the winter?",
            "How do scientists think monarch butterflies find their way?",
        ),
    ),
    (
        """
        Visiting hours at St. Mary's Hospital are from 10 a.m. to 8 p.m. every day. Each
        patient may have no more than two visitors at a time. Children under 12 must be with
        an adult at all times. In the intensive care unit, visits are limited to close family
        members and may not last longer than 30 minutes. Visitors should clean their hands
        with the gel provided at the entrance of each ward. Please do not visit if you have a
        cold, fever, or stomach illness. Flowers are not allowed in the intensive care unit,
        but they are welcome in other wards. Free parking for visitors is available in Lot C.
        """,
        (
            "How many visitors can a patient have at one time?",
            "Where can visitors park for free?",
        ),
    ),
    (
        """
        William Shakespeare was born in Stratford-upon-Avon, England, in 1564. As a young man,
        he moved to London, where he worked as an actor and writer. He became part of a theater
        company called the Lord Chamberlain's Men, which built the famous Globe Theatre in
        1599. Shakespeare wrote about 37 plays, including comedies such as A Midsummer Night's
        Dream, tragedies such as Hamlet and Romeo and Juliet, and history plays about English
        kings. He also wrote 154 sonnets. Many phrases he used, like "break the ice" and
        "wild-goose chase," are still common in English today. He died in 1616.
        """,
        (
            "In what year was the Globe Theatre built?",
            "How many sonnets did Shakespeare write?",
        ),
    ),
    (
        """
        To pair your AirTone wireless headphones with a phone, first make sure the headphones
        are turned off. Then press and hold the power button for about five seconds until the
        light flashes blue and red. Open the Bluetooth settings on your phone and select
        "AirTone 200" from the list of devices. When the connection is successful, you will
        hear a short beep and the light will turn solid blue. A full charge takes about two
        hours and gives up to 30 hours of playback. When the battery is low, the light flashes
        red and you will hear a voice message every five minutes.
        """,
        (
            "What does the light do when the headphones are ready to pair?",
            "How many hours of playback does a full charge give?",
        ),
    ),
    (
        """
        Penguins are birds that cannot fly, but they are excellent swimmers. Their wings have
        become stiff flippers that help them move quickly through the water. Most penguin
        species live in the Southern Hemisphere, and only one, the Galapagos penguin, lives
        close to the equator. The largest species is the emperor penguin, which can stand about
        1.1 meters tall. Emperor penguins breed during the freezing Antarctic winter. After the
        female lays a single egg, the male keeps it warm on his feet under a fold of skin for
        about two months, while the female goes to the sea to feed.
        """,
        (
            "Which penguin species lives close to the equator?",
            "Who keeps the emperor penguin's egg warm, and for how long?",
        ),
    ),
    (
        """
        On Tuesday evening, the Millbrook City Council voted 5 to 2 to build a new public
        swimming pool in Riverside Park. The pool will cost about 4.2 million dollars and will
        be paid for with a mix of state grants and city funds. Construction is expected to
        start next March and finish in time for the summer of the following year. The old pool
        on Center Street, which opened in 1968, will close permanently when the new one opens.
        Mayor Linda Ortiz said the new pool will include a shallow area for young children and
        will be fully accessible for people with disabilities.
        """,
        (
            "How much will the new swimming pool cost?",
            "What will happen to the old pool on Center Street?",
        ),
    ),
    (
        """
        Coffee is believed to have been discovered in Ethiopia. A well-known story tells of a
        goat herder named Kaldi who noticed that his goats became very energetic after eating
        red berries from a certain bush. By the fifteenth century, coffee was being grown in
        Yemen, and it soon became popular across the Middle East. The first coffee houses
        opened in cities like Mecca and Constantinople, where people met to talk, listen to
        music, and play games. Coffee arrived in Europe in the 1600s. Today, Brazil is the
        largest coffee producer in the world.
        """,
        (
            "According to the story, who discovered coffee?",
            "Which country is the largest coffee producer today?",
        ),
    ),
]

QA_INSTRUCTIONS: list[str] = [
    "Answer the question using only the information in the passage.\n\n"
    "Passage:\n{context}\n\nQuestion: {question}",
    "Read the text and answer the question.\n\nText: {context}\n\nQuestion: {question}\nAnswer:",
    "Context: {context}\n\nBased on the context above, {question_lc}",
    "{context}\n\nQuestion: {question}\nAnswer in one or two sentences, using the text above.",
    'Here is some information:\n\n"{context}"\n\n{question} Give a short answer.',
]

# --------------------------------------------------------------------------------------------
# chat framing: system prompts and short openers for multi-turn rows
# --------------------------------------------------------------------------------------------

SYSTEM_PROMPTS: dict[str, list[str]] = {
    "chat": [
        "You are a friendly and helpful assistant.",
        "You are a helpful writing assistant. Keep your answers clear and concise.",
    ],
    "code": [
        "You are a helpful programming assistant. Give correct code and short explanations.",
        "You are an experienced software engineer. Answer with clear, working code.",
    ],
    "math": [
        "You are a patient math tutor. Solve problems step by step and state the final answer "
        "clearly.",
        "You are a helpful assistant who is good at math. Show your work.",
    ],
    "translation": [
        "You are a professional translator. Translate accurately and naturally.",
        "You are a helpful assistant who speaks English, French, Spanish, and German fluently.",
    ],
    "summarization": [
        "You are a helpful assistant that writes clear and accurate summaries.",
        "You are an editor. Summarize texts briefly without adding new information.",
    ],
    "qa": [
        "You are a helpful assistant. Answer questions using only the given context.",
        "You answer reading comprehension questions briefly and accurately.",
    ],
}

OPENERS: dict[str, list[tuple[str, str]]] = {
    "chat": [
        ("Hi! Can you help me write something?", "Of course! What would you like me to write?"),
        ("I need a little help with something personal.", "I'd be happy to help. What is it?"),
    ],
    "code": [
        (
            "I'm working on a small programming project and I have a question.",
            "Sure, I can help with programming. What do you need?",
        ),
        ("Can you help me with some code?", "Yes. Tell me what you are working on."),
    ],
    "math": [
        (
            "Can you help me with my math homework?",
            "Yes, of course. Share the problem and I will solve it step by step.",
        ),
        ("I'm stuck on a word problem.", "No problem. What does the problem say?"),
    ],
    "translation": [
        (
            "I need help with a translation.",
            "Sure! Which text would you like me to translate, and into which language?",
        ),
        ("Do you know other languages?", "Yes, I can translate between several languages."),
    ],
    "summarization": [
        (
            "I have a text that is too long for me to read right now.",
            "No problem. Paste the text and I can summarize it for you.",
        ),
        ("Can you summarize things for me?", "Yes. Please share the text you want summarized."),
    ],
    "qa": [
        ("I have a question about a short text.", "Sure. Please share the text and your question."),
        (
            "Can you help me with a reading exercise?",
            "Of course. Send me the passage and the question.",
        ),
    ],
}

DOMAINS: tuple[str, ...] = ("chat", "code", "math", "translation", "summarization", "qa")


# --------------------------------------------------------------------------------------------
# assembly
# --------------------------------------------------------------------------------------------


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]


def _check_words(label: str, text: str, low: int, high: int) -> None:
    n = len(text.split())
    if not low <= n <= high:
        raise ValueError(f"{label}: {n} words, expected {low}-{high}: {text[:60]!r}")


def build_domain_prompts() -> dict[str, list[str]]:
    """Compose the prompt texts of every domain, in authored order."""
    math = [
        MATH_INSTRUCTIONS[i % len(MATH_INSTRUCTIONS)].format(problem=problem)
        for i, problem in enumerate(MATH_PROBLEMS)
    ]

    translation = []
    for i, (src, tgt, text) in enumerate(_translation_items()):
        template = TRANSLATION_INSTRUCTIONS[i % len(TRANSLATION_INSTRUCTIONS)]
        translation.append(template.format(src=src, tgt=tgt, text=text))

    summarization = []
    for i, raw in enumerate(SUMMARY_PASSAGES):
        passage = _flat(raw)
        _check_words(f"summarization passage {i}", passage, 80, 200)
        template = SUMMARY_INSTRUCTIONS[i % len(SUMMARY_INSTRUCTIONS)]
        summarization.append(template.format(passage=passage))

    qa = []
    for i, (raw, questions) in enumerate(QA_ITEMS):
        context = _flat(raw)
        _check_words(f"qa context {i}", context, 60, 150)
        for j, question in enumerate(questions):
            k = 2 * i + j
            template = QA_INSTRUCTIONS[k % len(QA_INSTRUCTIONS)]
            qa.append(
                template.format(
                    context=context, question=question, question_lc=_lower_first(question)
                )
            )

    return {
        "chat": list(CHAT_PROMPTS),
        "code": list(CODE_PROMPTS),
        "math": math,
        "translation": translation,
        "summarization": summarization,
        "qa": qa,
    }


def build_messages(domain: str, index: int, prompt: str) -> list[Message]:
    """The chat form of a prompt; ``index`` (0-based within the domain) picks the framing.

    Six rows per domain (index % 10 == 4) are multi-turn: a short opening exchange precedes
    the request. Two thirds of the single-turn rows carry a system message.
    """
    systems = SYSTEM_PROMPTS[domain]
    messages: list[Message] = []
    if index % 10 == 4:
        if index % 20 == 4:
            messages.append({"role": "system", "content": systems[0]})
        user, assistant = OPENERS[domain][(index // 10) % len(OPENERS[domain])]
        messages.append({"role": "user", "content": user})
        messages.append({"role": "assistant", "content": assistant})
    elif index % 3 != 2:
        messages.append({"role": "system", "content": systems[index % len(systems)]})
    messages.append({"role": "user", "content": prompt})
    return messages


def build_rows() -> list[dict[str, object]]:
    """All rows, validated and sorted by id."""
    per_domain = build_domain_prompts()
    rows: list[dict[str, object]] = []
    for domain in DOMAINS:
        prompts = per_domain[domain]
        if len(prompts) != PER_DOMAIN:
            raise ValueError(f"{domain}: {len(prompts)} prompts, expected {PER_DOMAIN}")
        for i, prompt in enumerate(prompts):
            _check_words(f"{domain} prompt {i}", prompt, 5, 400)
            rows.append(
                {
                    "id": f"{domain}-{i + 1:04d}",
                    "domain": domain,
                    "prompt": prompt,
                    "messages": build_messages(domain, i, prompt),
                    "source": SOURCE,
                }
            )

    dupes = [p for p, n in Counter(str(r["prompt"]) for r in rows).items() if n > 1]
    if dupes:
        raise ValueError(f"duplicate prompts: {dupes[:3]!r}")
    ids = [str(r["id"]) for r in rows]
    if len(set(ids)) != len(ids):
        raise ValueError("duplicate ids")
    rows.sort(key=lambda r: str(r["id"]))
    return rows


SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("domain", pa.string(), nullable=False),
        pa.field("prompt", pa.string(), nullable=False),
        pa.field(
            "messages",
            pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())])),
            nullable=False,
        ),
        pa.field("source", pa.string(), nullable=False),
    ]
)


def write_parquet(rows: list[dict[str, object]], out: Path) -> None:
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out, compression="zstd")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output Parquet path")
    args = parser.parse_args()

    rows = build_rows()
    write_parquet(rows, args.out)

    counts = Counter(str(r["domain"]) for r in rows)
    words = [len(str(r["prompt"]).split()) for r in rows]
    multi = sum(1 for r in rows if any(m["role"] == "assistant" for m in r["messages"]))
    print(f"wrote {len(rows)} rows to {args.out}")
    print("per domain: " + ", ".join(f"{d}={counts[d]}" for d in DOMAINS))
    print(
        f"prompt words: min={min(words)} median={statistics.median(words)} max={max(words)}; "
        f"multi-turn rows: {multi}"
    )


if __name__ == "__main__":
    main()
