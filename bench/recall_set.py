"""The evaluation set of bench/bench_recall.py: long multi-session conversations between two
friends, generated from templates with a fixed seed (written for this repository, copied from no
dataset), and questions about them phrased the way a user or an agent asks — each with the turns
that hold its answer (its evidence).

How a fact is told: one friend asks about something ("How was the vacation?"), the other
answers in the next turn ("We spent ten days hiking in Patagonia."). A question about it uses
its own words: some of the time the asking turn's words in another form or a synonym ("Where
did Ana go on holiday?"), some of the time the answer's. The evidence is the answering turn
(for a few facts also the asking one, when it holds part of the answer). Around the facts:
small talk, and the same topics told about the other friend with other values, so a question
must find the right one.

Kinds: ``single`` (one fact), ``multi`` (two facts in one question; either evidence turn
counts as found), ``temporal`` (when something happened: the answer names a day), and
``cjk`` (conversations and questions in Chinese or Japanese, any of the above).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import random

SEED = 20261201
CONVERSATIONS_EN = 18
CONVERSATIONS_ZH = 3
CONVERSATIONS_JA = 2
SESSIONS = 5  #: sessions per conversation
SMALL_TALK = 16  #: small-talk turns per session, around its facts


@dataclasses.dataclass(frozen=True)
class Turn:
    """One message: who said it (``user`` is the conversation's first friend) and its text."""

    role: str
    text: str


@dataclasses.dataclass(frozen=True)
class Question:
    """A question about one conversation and the turns (session, index) that answer it."""

    conversation: int
    kind: str
    text: str
    evidence: tuple[tuple[int, int], ...]


@dataclasses.dataclass(frozen=True)
class Conversation:
    """Sessions of turns between two friends; ``names[0]`` speaks as ``user``."""

    names: tuple[str, str]
    language: str
    sessions: list[list[Turn]]
    dates: list[dt.date]


# ---------------------------------------------------------------------------------------------
# topics: (asking turn, answering turn, questions [(kind, text)], values)
# {n} is the friend the fact is about, {o} the other; values are drawn per use


@dataclasses.dataclass(frozen=True)
class Topic:
    ask: str
    answer: str
    questions: tuple[str, ...]  #: paraphrases; one is drawn
    values: dict[str, tuple[str, ...]]
    #: a clause for a two-fact question ("the name of {n}'s dog")
    clause: str = ""
    when: str = ""  #: a temporal question, when the answer names a day
    #: the asking turn holds part of the answer too
    ask_is_evidence: bool = False


EN_TOPICS = [
    Topic(
        "Did you end up adopting that puppy from the shelter?",
        "We did! She's a beagle mix and we named her {pet}. She already owns the couch.",
        (
            "What name did {n} give the dog {n} adopted?",
            "What is {n}'s new dog called?",
            "What did {n} call the puppy from the shelter?",
        ),
        {"pet": ("Biscuit", "Pepper", "Maple", "Juniper", "Clover", "Hazel", "Olive", "Nova")},
        clause="the name of {n}'s dog",
    ),
    Topic(
        "How is the relocation going? Are the boxes unpacked yet?",
        "Mostly! We finally settled in {city}, the apartment is two blocks from the river.",
        (
            "Which city did {n} move to?",
            "Where does {n} live now after relocating?",
            "Where did {n} settle after the move?",
        ),
        {"city": ("Lisbon", "Denver", "Osaka", "Tallinn", "Porto", "Calgary", "Leipzig", "Hobart")},
        clause="the city {n} moved to",
    ),
    Topic(
        "Any news on the job hunt? You had interviews lined up.",
        "I accepted the offer from {company}, I'll be working as a {job} there.",
        (
            "What job offer did {n} accept?",
            "Where does {n} work now?",
            "Which company hired {n} after the interviews?",
        ),
        {
            "company": ("Northwind", "Brightline", "Kestrel Labs", "Halcyon", "Bluefin", "Orrery"),
            "job": ("data analyst", "nurse", "product designer", "sous chef", "teacher", "pilot"),
        },
        clause="the company {n} joined",
    ),
    Topic(
        "Are you still taking music lessons on Thursdays?",
        "Yes, I'm learning the {instrument} now, I practice every evening after dinner.",
        (
            "Which instrument is {n} learning to play?",
            "What instrument does {n} practise?",
            "What is {n} studying in those music lessons?",
        ),
        {"instrument": ("cello", "banjo", "clarinet", "ukulele", "harp", "trumpet", "oboe")},
        clause="the instrument {n} plays",
    ),
    Topic(
        "How was the vacation? You look rested.",
        "Amazing, we spent ten days hiking around {place} and barely checked our phones.",
        (
            "Where did {n} go on holiday?",
            "Where did {n} spend the vacation?",
            "Which place did {n} hike in during the trip?",
        ),
        {"place": ("Patagonia", "the Dolomites", "Iceland", "Yosemite", "Tasmania", "the Alps")},
        clause="where {n} went on vacation",
    ),
    Topic(
        "Read anything good lately?",
        "I just finished {book}, I couldn't put it down, stayed up until two to end it.",
        (
            "What book has {n} read recently?",
            "Which novel did {n} finish lately?",
            "What was {n} reading that kept them up at night?",
        ),
        {"book": ("The Salt Road", "Paper Lanterns", "A Winter Orchard", "Glass Rivers")},
        clause="the book {n} finished",
    ),
    Topic(
        "Want to grab dinner on Friday? Anything you can't eat?",
        "Sure! Just remember I'm allergic to {food}, so no {food} anywhere near my plate.",
        (
            "What is {n} allergic to?",
            "What food allergy does {n} have?",
            "Which food must {n} avoid?",
        ),
        {"food": ("peanuts", "shellfish", "sesame", "kiwi", "walnuts", "eggs")},
        clause="what {n} is allergic to",
    ),
    Topic(
        "What did you get up to on the weekend?",
        "On {day} I went to the {event} at the community center, it was really moving.",
        (
            "Did {n} go to the {event}?",
            "What did {n} attend at the community center?",
        ),
        {
            "day": ("Saturday", "Sunday"),
            "event": ("support group", "pottery class", "charity run", "book club", "poetry night"),
        },
        when="When did {n} go to the {event}?",
    ),
    Topic(
        "We still have to settle the retry policy for the upload service.",
        "Let's go with {count} attempts with exponential backoff, then we give up and alert.",
        (
            "What did we decide about retrying uploads?",
            "How many times do failed uploads get retried?",
            "What was agreed for the upload retries?",
        ),
        {"count": ("three", "five", "four", "six")},
        clause="how uploads are retried",
        ask_is_evidence=True,
    ),
    Topic(
        "What are you getting your sister for her birthday?",
        "Probably a {gift}, she has been hinting about one for months.",
        (
            "What gift is {n} planning for the sister's birthday?",
            "What present will {n} buy for the sister?",
        ),
        {"gift": ("record player", "telescope", "sewing machine", "espresso maker", "kayak")},
        clause="the present for {n}'s sister",
    ),
    Topic(
        "Did the mechanic ever fix your car?",
        "Yes, they replaced the {part}; it cost {amount} dollars, ouch.",
        (
            "How much did {n}'s car repair cost?",
            "What did the garage replace on {n}'s car?",
            "What part of the car was repaired?",
        ),
        {
            "part": ("alternator", "timing belt", "radiator", "brake pads", "clutch"),
            "amount": ("four hundred", "nine hundred", "twelve hundred", "six hundred"),
        },
        clause="what was replaced on {n}'s car",
    ),
    Topic(
        "Are you training for anything at the moment?",
        "I signed up for the {race} in {month}, running five mornings a week.",
        (
            "Which race is {n} training for?",
            "What race did {n} register for?",
            "What is {n} running for?",
        ),
        {
            "race": ("city half marathon", "trail ultra", "harbour 10k", "mountain relay"),
            "month": ("March", "May", "September", "October"),
        },
        clause="the race {n} entered",
        when="When is {n}'s race?",
    ),
    Topic(
        "How did the doctor's appointment go?",
        "Fine, the doctor said my {organ} looks healthy, I just need to drink more water.",
        (
            "What did the doctor tell {n}?",
            "What was the result of {n}'s medical checkup?",
        ),
        {"organ": ("heart", "liver", "knee", "back")},
        clause="what the doctor said to {n}",
    ),
    Topic(
        "Have you picked a name for the band yet?",
        "We're calling ourselves {band}, the drummer came up with it.",
        (
            "What is the name of {n}'s band?",
            "What are {n} and the bandmates called?",
        ),
        {"band": ("The Quiet Foxes", "Static Bloom", "Low Tide Choir", "Velvet Compass")},
        clause="the band's name",
    ),
    Topic(
        "What did you end up planting in the garden this spring?",
        "Mostly {plant}, plus a few herbs near the kitchen window.",
        (
            "What did {n} plant in the garden?",
            "Which plants is {n} growing this year?",
        ),
        {"plant": ("tomatoes", "sunflowers", "strawberries", "lavender", "pumpkins")},
        clause="what {n} planted",
    ),
    Topic(
        "Where did you two celebrate your anniversary?",
        "We went back to {restaurant}, the place where we had our first date.",
        (
            "Where did {n} celebrate the anniversary?",
            "Which restaurant did {n} pick for the anniversary dinner?",
        ),
        {"restaurant": ("Casa Luma", "The Olive Tree", "Bistro Marais", "Sakura House")},
        clause="where {n} celebrated the anniversary",
        when="When did {n} last go to {restaurant}?",
    ),
]

EN_SMALL_TALK = [
    "How's your week going so far?",
    "Pretty busy, lots of meetings, but good.",
    "Haha, that sounds like fun.",
    "The weather has been really nice lately.",
    "I know, I finally got to sit outside with a coffee.",
    "Did you see the game last night?",
    "No, I fell asleep early, was it good?",
    "Not bad, went to overtime.",
    "I'm so tired today, the neighbours were loud.",
    "Ugh, sorry to hear that.",
    "Anyway, what's new with you?",
    "Not much honestly, work and sleep.",
    "That makes sense, it's been a long month.",
    "Let's catch up properly soon.",
    "Totally, I miss our long talks.",
    "Did you try that new bakery downstairs?",
    "Yes, their bread is great but the coffee is weak.",
    "I've been cooking more at home to save money.",
    "Good idea, eating out adds up fast.",
    "I watched a documentary about octopuses, they're so smart.",
    "Oh I love those, send me the title.",
    "My phone screen cracked again this morning.",
    "Again? You need a better case.",
    "I started going to bed earlier and I feel much better.",
    "Sleep really changes everything.",
    "Thanks for listening, it means a lot.",
    "Of course, that's what friends are for.",
    "Talk to you later, I have to run.",
    "Sure, have a good one!",
    "How is your family doing?",
    "Everyone's fine, my mom says hi.",
    "Tell her I said hi back.",
    "I'm thinking about redecorating the living room.",
    "What colour are you thinking of?",
    "Maybe a soft green, something calm.",
    "I had the weirdest dream last night.",
    "Tell me everything.",
    "That's wild, I'd have woken up confused too.",
]
EN_NAMES = [
    ("Ana", "Ben"), ("Caroline", "Mel"), ("Dev", "Priya"), ("Elena", "Sam"), ("Farid", "Jo"),
    ("Grace", "Tom"), ("Hiro", "Lena"), ("Ines", "Marco"), ("Jonah", "Ruth"), ("Kara", "Liam"),
    ("Luis", "Nadia"), ("Maya", "Owen"), ("Nico", "Zoe"), ("Omar", "Iris"), ("Paula", "Quinn"),
    ("Rosa", "Sven"), ("Tariq", "Uma"), ("Vera", "Will"),
]  # fmt: skip

ZH_TOPICS = [
    Topic(
        "周末去吃饭了吗？",
        "去了，那家餐厅叫{restaurant}，在{area}附近，川菜特别地道。",
        ("{n}周末吃饭的那家餐馆叫什么名字？", "我上次说的那家餐厅叫什么"),
        {
            "restaurant": ("小南国", "蜀香园", "老街坊", "川味轩"),
            "area": ("静安寺", "人民广场", "五道口", "西湖"),
        },
        clause="那家餐厅的名字",
    ),
    Topic(
        "新家收拾好了吗？",
        "差不多了，我们最后搬到了{city}，离公司很近。",
        ("{n}搬到哪个城市了？", "{n}现在住在哪里？"),
        {"city": ("杭州", "成都", "苏州", "厦门", "青岛")},
        clause="{n}搬去的城市",
    ),
    Topic(
        "新工作找得怎么样了？",
        "我接受了{company}的录用通知，去做{job}。",
        ("{n}现在在哪家公司上班？", "{n}最后去了哪个公司工作？"),
        {
            "company": ("星河科技", "远景集团", "青松医院", "蓝海物流"),
            "job": ("工程师", "会计", "设计师"),
        },
        clause="{n}的新公司",
    ),
    Topic(
        "你家的小狗最近好吗？",
        "很好，我们给它取名叫{pet}，天天在沙发上睡觉。",
        ("{n}的狗叫什么名字？", "{n}给小狗起了什么名字？"),
        {"pet": ("豆豆", "旺财", "球球", "元宝")},
        clause="{n}的狗的名字",
    ),
    Topic(
        "假期去哪儿玩了？",
        "我们去{place}徒步了十天，风景太美了。",
        ("{n}假期去了哪里旅行？", "{n}放假的时候去哪儿玩了？"),
        {"place": ("云南", "新疆", "西藏", "桂林")},
        clause="{n}旅行去的地方",
    ),
    Topic(
        "上周末你做什么了？",
        "{day}我去参加了社区中心的{event}，收获很大。",
        ("{n}参加了什么活动？",),
        {"day": ("星期六", "星期天"), "event": ("读书会", "互助小组", "陶艺课")},
        when="{n}是哪天去的{event}？",
    ),
]
ZH_SMALL_TALK = [
    "最近怎么样？",
    "还行，就是工作有点忙。",
    "哈哈，听起来挺有意思的。",
    "这几天天气真不错。",
    "是啊，终于可以出去走走了。",
    "昨晚的比赛你看了吗？",
    "没有，我很早就睡了。",
    "今天好累啊，邻居太吵了。",
    "辛苦了，早点休息吧。",
    "你最近有什么新鲜事吗？",
    "没什么，就是上班下班。",
    "改天我们好好聊聊。",
    "好呀，我也很想你。",
    "楼下新开了一家面包店。",
    "我最近在家做饭，省钱。",
    "家里人都好吗？",
    "都挺好的，我妈还问起你呢。",
    "我的手机屏幕又摔碎了。",
    "谢谢你听我说这些。",
    "先不聊了，我得走了。",
]
ZH_NAMES = [("小王", "李明"), ("张伟", "刘芳"), ("陈静", "赵磊")]

JA_TOPICS = [
    Topic(
        "来週の打ち合わせの日程は決まった？",
        "{day}の午後{hour}時からになったよ。会議室も予約済み。",
        ("打ち合わせはいつに決まった？", "{n}さんのミーティングは何曜日？"),
        {"day": ("月曜日", "水曜日", "金曜日"), "hour": ("二", "三", "四")},
        clause="打ち合わせの日",
    ),
    Topic(
        "最近何か習い事を始めた？",
        "{instrument}を習い始めたんだ。毎晩練習してるよ。",
        ("{n}さんは何の楽器を習っているの？", "{n}さんが練習している楽器は何？"),
        {"instrument": ("チェロ", "バイオリン", "ピアノ", "三味線")},
        clause="{n}さんの楽器",
    ),
    Topic(
        "引っ越しはもう終わった？",
        "うん、結局{city}に引っ越したよ。駅から近くて便利。",
        ("{n}さんはどこに引っ越したの？", "{n}さんの新しい住まいはどの街？"),
        {"city": ("京都", "福岡", "札幌", "仙台")},
        clause="{n}さんの引っ越し先",
    ),
    Topic(
        "週末は何をしてたの？",
        "{day}に公民館の{event}に行ってきたよ。",
        ("{n}さんは週末どこに行った？",),
        {"day": ("土曜日", "日曜日"), "event": ("料理教室", "読書会", "写真展")},
        when="{n}さんが{event}に行ったのはいつ？",
    ),
    Topic(
        "誕生日プレゼントは何にしたの？",
        "妹には{gift}をあげることにした。ずっと欲しがってたから。",
        ("{n}さんは妹に何を贈るの？", "{n}さんのプレゼントは何？"),
        {"gift": ("腕時計", "カメラ", "自転車", "着物")},
        clause="{n}さんのプレゼント",
    ),
]
JA_SMALL_TALK = [
    "最近どう？",
    "まあまあかな、仕事が忙しくて。",
    "それは楽しそうだね。",
    "最近いい天気が続いてるね。",
    "昨日の試合見た？",
    "ううん、早く寝ちゃった。",
    "今日はすごく疲れた。",
    "お疲れさま、ゆっくり休んでね。",
    "何か新しいことあった？",
    "特にないよ、仕事ばっかり。",
    "今度ゆっくり話そうね。",
    "家族は元気？",
    "みんな元気だよ、ありがとう。",
    "スマホの画面がまた割れちゃった。",
    "話を聞いてくれてありがとう。",
    "じゃあまたね。",
]
JA_NAMES = [("田中", "佐藤"), ("鈴木", "高橋")]

MULTI = {
    "en": "Remind me of {c1} and {c2}.",
    "zh": "{c1}和{c2}分别是什么？",
    "ja": "{c1}と{c2}を教えて。",
}


def build(seed: int = SEED) -> tuple[list[Conversation], list[Question]]:
    """The conversations and the questions about them, the same for a seed."""
    rng = random.Random(seed)
    conversations: list[Conversation] = []
    questions: list[Question] = []
    plan = (
        [("en", EN_TOPICS, EN_SMALL_TALK, EN_NAMES[i]) for i in range(CONVERSATIONS_EN)]
        + [("zh", ZH_TOPICS, ZH_SMALL_TALK, ZH_NAMES[i]) for i in range(CONVERSATIONS_ZH)]
        + [("ja", JA_TOPICS, JA_SMALL_TALK, JA_NAMES[i]) for i in range(CONVERSATIONS_JA)]
    )
    for number, (language, topics, talk, names) in enumerate(plan):
        conversation, found = _conversation(rng, number, language, topics, talk, names)
        conversations.append(conversation)
        questions.extend(found)
    return conversations, questions


def _conversation(
    rng: random.Random,
    number: int,
    language: str,
    topics: list[Topic],
    talk: list[str],
    names: tuple[str, str],
) -> tuple[Conversation, list[Question]]:
    start = dt.date(2026, 1, 5) + dt.timedelta(days=rng.randrange(200))
    dates = [start + dt.timedelta(days=9 * s + rng.randrange(5)) for s in range(SESSIONS)]
    # each topic told about both friends (other values), spread over the sessions
    told: list[tuple[int, Topic, dict[str, str]]] = []
    for topic in topics:
        for who in (0, 1):
            values = {k: rng.choice(v) for k, v in topic.values.items()}
            told.append((who, topic, values))
    rng.shuffle(told)
    per_session: list[list[tuple[int, Topic, dict[str, str]]]] = [[] for _ in range(SESSIONS)]
    for i, item in enumerate(told):
        per_session[i % SESSIONS].append(item)
    sessions: list[list[Turn]] = []
    facts: list[tuple[int, Topic, dict[str, str], int, int]] = []  # who, topic, values, s, i
    for s, items in enumerate(per_session):
        turns: list[Turn] = []
        chat = rng.sample(talk, min(SMALL_TALK, len(talk)))
        slots = sorted(rng.sample(range(len(chat) + 1), len(items)))
        last = 0
        for slot, (who, topic, values) in zip(slots, items, strict=True):
            turns.extend(_said(len(turns), line) for line in chat[last:slot])
            last = slot
            # the asker is the other friend: roles alternate from whoever speaks next
            if _speaker(len(turns)) == who:
                turns.append(_said(len(turns), rng.choice(talk)))
            turns.append(_said(len(turns), topic.ask))
            facts.append((who, topic, values, s, len(turns)))
            turns.append(_said(len(turns), topic.answer.format(**values)))
            turns.append(_said(len(turns), rng.choice(talk)))
        turns.extend(_said(len(turns), line) for line in chat[last:])
        while len(turns) < 24:
            turns.append(_said(len(turns), rng.choice(talk)))
        sessions.append(turns)
    conversation = Conversation(names, language, sessions, dates)
    return conversation, _questions(rng, number, language, names, dates, facts)


def _speaker(index: int) -> int:
    return index % 2  # the first friend (user) speaks at even indexes


def _said(index: int, text: str) -> Turn:
    return Turn("user" if _speaker(index) == 0 else "assistant", text)


def _questions(
    rng: random.Random,
    number: int,
    language: str,
    names: tuple[str, str],
    dates: list[dt.date],
    facts: list[tuple[int, Topic, dict[str, str], int, int]],
) -> list[Question]:
    found: list[Question] = []
    kind = "cjk" if language != "en" else None
    for who, topic, values, s, i in facts:
        evidence = ((s, i - 1), (s, i)) if topic.ask_is_evidence else ((s, i),)
        fill = {**values, "n": names[who], "o": names[1 - who]}
        text = rng.choice(topic.questions).format(**fill)
        found.append(Question(number, kind or "single", text, evidence))
        if topic.when:
            found.append(Question(number, kind or "temporal", topic.when.format(**fill), evidence))
    # two facts about the same friend in one question
    clauses = [f for f in facts if f[1].clause]
    for _ in range(4):
        first, second = rng.sample(clauses, 2)
        if first[0] != second[0]:
            second = next((f for f in clauses if f[0] == first[0] and f is not first), second)
        c1 = first[1].clause.format(n=names[first[0]])
        c2 = second[1].clause.format(n=names[second[0]])
        text = MULTI[language].format(c1=c1, c2=c2)
        evidence = ((first[3], first[4]), (second[3], second[4]))
        found.append(Question(number, kind or "multi", text, evidence))
    return found


# ---------------------------------------------------------------------------------------------
# the miss classes (issue 43): conversations of their own, each built to test one way a
# lexical search misses, with its own questions. A scene is a few consecutive turns (who says
# each: ``True`` the friend the fact is about), the evidence turn's index in it and questions.
# Scenes start on whichever friend they name first; a small-talk turn is put in front when the
# alternation needs it.

Scene = tuple[tuple[tuple[bool, str], ...], int, tuple[str, ...]]


@dataclasses.dataclass(frozen=True)
class SceneTopic:
    """Turns ``(about, text)`` where ``about`` is True for the friend the fact is about; the
    evidence turn (its index); question paraphrases (one drawn); values drawn per use."""

    turns: tuple[tuple[bool, str], ...]
    evidence: int
    questions: tuple[str, ...]
    values: dict[str, tuple[str, ...]]


# elliptical answers: the answer turn holds none of the question's subject; it is in the 1-3
# turns before it (the asking turn, or the friend's own turn before a reply)
ELLIPTICAL = [
    SceneTopic(
        (
            (False, "Did you ever go kayaking on the lake like you planned?"),
            (True, "Yes, {count} last month! The second time we even saw a heron."),
        ),
        1,
        ("How many times did {n} go kayaking?", "Did {n} manage to go kayaking on the lake?"),
        {"count": ("twice", "three times", "four times", "once")},
    ),
    SceneTopic(
        (
            (True, "Remember the half marathon I kept talking about in spring?"),
            (False, "Of course! Did you sign up in the end?"),
            (True, "Done, registered yesterday. My goal is {goal}."),
        ),
        2,
        (
            "What finish time is {n} aiming for in the half marathon?",
            "What is {n}'s goal for the half marathon?",
        ),
        {"goal": ("under two hours", "1:45", "just finishing", "1:55 or better")},
    ),
    SceneTopic(
        (
            (False, "Did your sister have the baby yet?"),
            (True, "Not yet when we last talked, right?"),
            (False, "Right, you said any day now."),
            (True, "Last Friday! A little girl, they called her {baby}."),
        ),
        3,
        ("What is the name of {n}'s sister's baby?", "What did {n}'s sister call her baby?"),
        {"baby": ("Amelia", "Rosalind", "Greta", "Noor", "Ivy", "Thea")},
    ),
    SceneTopic(
        (
            (True, "I finally finished restoring the old motorbike in the garage."),
            (False, "No way, after two years? What does it look like?"),
            (True, "{colour} with white stripes, and it starts on the first try."),
        ),
        2,
        (
            "What colour is {n}'s restored motorbike?",
            "What does {n}'s old motorbike look like now?",
        ),
        {"colour": ("Racing green", "Deep red", "Matte black", "Sky blue", "Mustard yellow")},
    ),
    SceneTopic(
        (
            (False, "Did you ever hear back from the landlord about the leak in the bathroom?"),
            (True, "Ugh, that saga."),
            (False, "Tell me he did something about it."),
            (True, "Finally! Someone came on {day} and it's all sorted now."),
        ),
        3,
        (
            "When did the landlord deal with the leak in {n}'s bathroom?",
            "When was the bathroom leak at {n}'s place handled?",
        ),
        {"day": ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday")},
    ),
    SceneTopic(
        (
            (False, "How did the driving test go in the end?"),
            (True, "{attempt}, and the examiner was surprisingly kind about my parking."),
        ),
        1,
        (
            "On which attempt did {n} get through the driving test?",
            "How did {n}'s driving test go?",
        ),
        {"attempt": ("Passed on the first go", "Second time lucky", "Third attempt, finally")},
    ),
]

# paraphrase: the question shares no word with the answer; at most one with the turn before
PARAPHRASE = [
    SceneTopic(
        (
            (False, "What do you get up to on weekends these days?"),
            (True, "Mostly {hobby}, and I joined a {club} that meets on Sundays."),
        ),
        1,
        ("What does {n} do on weekends for fun?", "What are {n}'s hobbies?"),
        {
            "hobby": ("bouldering", "birdwatching", "pottery", "sea swimming", "woodworking"),
            "club": ("choir", "chess club", "running crew", "sketching group"),
        },
    ),
    SceneTopic(
        (
            (False, "How is the database migration going at work?"),
            (True, "We moved everything to {store}, the datastore finally keeps up with traffic."),
        ),
        1,
        ("Which database did {n}'s team switch to?", "What storage system does {n} use now?"),
        {"store": ("Cassandra", "CockroachDB", "ClickHouse", "FoundationDB", "ScyllaDB")},
    ),
    SceneTopic(
        (
            (False, "Who has been mentoring you since you started there?"),
            (True, "{mentor} took me under her wing, she reviews my drafts every week."),
        ),
        1,
        ("Who is {n}'s mentor?", "Who mentors {n} at the new job?"),
        {"mentor": ("Dolores", "Harriet", "Mireille", "Beatrix", "Ottilie")},
    ),
    SceneTopic(
        (
            (False, "Where are you heading for the holidays this year?"),
            (True, "We booked two weeks in {place}, the flights are already paid."),
        ),
        1,
        ("Where is {n} going on vacation?", "Where is {n} spending the holidays?"),
        {"place": ("Sardinia", "Crete", "Madeira", "Hokkaido", "Zanzibar")},
    ),
    SceneTopic(
        (
            (False, "How is your dad recovering after the surgery?"),
            (True, "Much better, he manages {distance} a day now with the physio."),
        ),
        1,
        ("How is {n}'s father doing after his operation?", "How is {n}'s dad's recovery going?"),
        {"distance": ("two kilometres", "a mile", "twenty minutes on foot", "the stairs twice")},
    ),
]

# long turns: the answer is one sentence in a long turn; short turns share its common word
LONG = [
    SceneTopic(
        (
            (False, "How was the conference? You were away all week."),
            (
                True,
                "{filler} The keynote at the conference was given by {speaker}, who spoke about "
                "{theme}. {filler}",
            ),
        ),
        1,
        (
            "Who gave the keynote at the conference {n} went to?",
            "What was the keynote about at {n}'s conference?",
        ),
        {
            "speaker": ("Dr Okafor", "Professor Lindqvist", "Ms Tanaka", "Mr Varga"),
            "theme": ("urban beekeeping", "tidal energy", "soil microbes", "glacier retreat"),
        },
    ),
    SceneTopic(
        (
            (False, "How was the wedding? I saw the photos."),
            (
                True,
                "{filler} At the wedding the band played {song} for the first dance and "
                "everybody cried. {filler}",
            ),
        ),
        1,
        (
            "Which song was played for the first dance at the wedding {n} attended?",
            "What was the first dance song at the wedding?",
        ),
        {"song": ("Moon River", "La Vie en Rose", "Harvest Moon", "Fly Me to the Moon")},
    ),
    SceneTopic(
        (
            (False, "How did the house viewing go on Saturday?"),
            (
                True,
                "{filler} The house itself has a {feature}, which is what sold it for us. {filler}",
            ),
        ),
        1,
        ("What feature of the house sold it to {n}?", "What did {n} like about the house?"),
        {"feature": ("walled garden", "south-facing attic", "wood stove", "cellar workshop")},
    ),
]
LONG_FILLER = [
    "We set off early and the traffic was awful for the first hour, then it cleared.",
    "I had packed far too much, as usual, and the suitcase barely closed.",
    "The hotel was fine, nothing special, but the breakfast was generous.",
    "On the first evening we walked around the old town and found a tiny bakery.",
    "My phone kept losing signal, which honestly was a relief after a busy month.",
    "There were a lot of people I had not seen in years, so the days flew by.",
    "We ate far too much and stayed up late talking about everything and nothing.",
    "By the end of it I was exhausted but really glad I went.",
    "Coming back, the train was delayed twice and we only got home after midnight.",
    "I took loads of pictures, I will send you the good ones when I sort them.",
]
LONG_SHORT_TALK = [
    "I skipped the keynote at the conference, it was far too early.",
    "The conference coffee was terrible again.",
    "Conference season is exhausting, honestly.",
    "The wedding photos are finally online.",
    "Weddings make me cry every single time.",
    "Another wedding invite came today.",
    "The house next door is for sale again.",
    "Cleaning the house took the whole Saturday.",
    "Our house is always cold in the mornings.",
    "The first dance lessons start next week.",
    "What was that song on the radio this morning?",
]

# dates: a weekly diary told in every session (the same words each time); a question names
# the day, which only the session's date holds
DIARY = [
    SceneTopic(
        (
            (False, "What did you make for dinner tonight?"),
            (True, "I cooked {dish}, it turned out better than expected."),
        ),
        1,
        ("What did {n} cook on {date}?", "What was {n}'s dinner on {date}?"),
        {
            "dish": (
                "a mushroom risotto",
                "lentil soup",
                "a Thai green curry",
                "fish tacos",
                "shakshuka",
                "gnocchi with sage butter",
                "a chickpea stew",
                "ramen",
                "stuffed peppers",
                "a leek pie",
                "pad thai",
                "a bean chilli",
            )
        },
    ),
]
DIARY_SESSIONS = 10
DATE_FORMS = ("%B %d, %Y", "%d %B %Y", "%Y-%m-%d", "%B %d")

EXTRA = {  # class: (conversations, scenes) — scenes told about each friend per conversation
    "elliptical": (4, ELLIPTICAL),
    "paraphrase": (3, PARAPHRASE),
    "long": (3, LONG),
    "speaker": (3, ELLIPTICAL[:1] + PARAPHRASE[:2] + LONG[:1]),
    "date": (3, DIARY),
}
#: names of the added conversations' friends (after the EN_NAMES pairs)
EXTRA_NAMES = [
    ("Abel", "Bea"), ("Cleo", "Dario"), ("Edith", "Felix"), ("Gus", "Hana"), ("Ivo", "Jana"),
    ("Kofi", "Lise"), ("Mira", "Nils"), ("Odile", "Pavel"), ("Rhea", "Sol"), ("Tove", "Ugo"),
    ("Vik", "Wren"), ("Xena", "Yusuf"), ("Zora", "Alvar"), ("Bruno", "Celia"), ("Dina", "Emil"),
    ("Fleur", "Gideon"),
]  # fmt: skip


def build_extra(first: int, seed: int = SEED) -> tuple[list[Conversation], list[Question]]:
    """The miss classes' conversations (numbered from ``first``) and questions."""
    rng = random.Random(seed + 43)
    conversations: list[Conversation] = []
    questions: list[Question] = []
    names = iter(EXTRA_NAMES)
    for kind, (count, topics) in EXTRA.items():
        for _ in range(count):
            pair = next(names)
            conversation, found = _scenes(rng, first + len(conversations), kind, topics, pair)
            conversations.append(conversation)
            questions.extend(found)
    return conversations, questions


def _scenes(
    rng: random.Random, number: int, kind: str, topics: list[SceneTopic], names: tuple[str, str]
) -> tuple[Conversation, list[Question]]:
    sessions_n = DIARY_SESSIONS if kind == "date" else SESSIONS
    start = dt.date(2026, 1, 5) + dt.timedelta(days=rng.randrange(200))
    dates = [start + dt.timedelta(days=7 * s + rng.randrange(3)) for s in range(sessions_n)]
    told: list[tuple[int, SceneTopic, int]] = []  # who, topic, session
    if kind == "date":  # every diary topic, about both friends, in every session
        told = [(who, t, s) for s in range(sessions_n) for t in topics for who in (0, 1)]
    else:
        items = [(who, t) for t in topics for who in (0, 1)]
        rng.shuffle(items)
        told = [(who, t, i % sessions_n) for i, (who, t) in enumerate(items)]
    talk = LONG_SHORT_TALK + EN_SMALL_TALK if kind == "long" else EN_SMALL_TALK
    sessions: list[list[Turn]] = []
    questions: list[Question] = []
    for s in range(sessions_n):
        here = [(who, t) for who, t, at in told if at == s]
        chat = rng.sample(talk, min(SMALL_TALK, len(talk)))
        slots = sorted(rng.choices(range(len(chat) + 1), k=len(here)))
        turns: list[Turn] = []
        last = 0
        for slot, (who, topic) in zip(slots, here, strict=True):
            turns.extend(_said(len(turns), line) for line in chat[last:slot])
            last = slot
            first_about = topic.turns[0][0]
            first_speaker = who if first_about else 1 - who
            if _speaker(len(turns)) != first_speaker:
                turns.append(_said(len(turns), rng.choice(talk)))
            values = {k: rng.choice(v) for k, v in topic.values.items()}
            base = len(turns)
            for _, text in topic.turns:
                filled = text.format(filler=" ".join(rng.sample(LONG_FILLER, 4)), **values)
                turns.append(_said(len(turns), filled))
            date = dates[s].strftime(rng.choice(DATE_FORMS)).replace(" 0", " ")
            fill = {**values, "n": names[who], "o": names[1 - who], "date": date}
            text = rng.choice(topic.questions).format(**fill)
            questions.append(Question(number, kind, text, ((s, base + topic.evidence),)))
        turns.extend(_said(len(turns), line) for line in chat[last:])
        if kind == "speaker":  # a transcript: every turn starts with its speaker's name
            turns = [
                Turn(t.role, f"{names[0 if t.role == 'user' else 1]}: {t.text}") for t in turns
            ]
        sessions.append(turns)
    return Conversation(names, "en", sessions, dates), questions
