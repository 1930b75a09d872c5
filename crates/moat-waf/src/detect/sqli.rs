//! SQL injection: a SQL lexer (MySQL, PostgreSQL, MSSQL, Oracle, SQLite
//! syntax: quotes with doubling and backslash escapes, `--`, `#`, `/* */` and
//! MySQL `/*! */` comments, `@var`/`@@var`, hex and exponent numbers) and a
//! grammar check run in three input contexts: the value inserted bare (numeric
//! context), inside a single-quoted string and inside a double-quoted string.
//!
//! A value is an injection when, in some context, it breaks out of that
//! context and continues with SQL structure: `UNION SELECT`, a `SELECT` with a
//! select list and `FROM`, stacked statements, a boolean tautology
//! (`' OR 'a'='a`), a clause after closing parentheses, or a time/out-of-band
//! function call. English text does not lex into those shapes.

use super::{Attack, Hit};

/// Token kinds of the SQL lexer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum T {
    Str,
    Num,
    Word,
    Kw(K),
    Var,
    Cmp,
    Bool,
    Concat,
    Arith,
    LParen,
    RParen,
    Comma,
    Semi,
    Dot,
    Comment,
    Other,
}

/// Keyword classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum K {
    Union,
    Select,
    From,
    Clause,
    Stmt,
    Case,
    CmpWord,
    Literal,
    All,
    Delay,
    As,
    Into,
    Table,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Tok {
    pub t: T,
    pub s: usize,
    pub e: usize,
}

const MAX_TOKENS: usize = 512;

fn keyword(w: &[u8]) -> Option<K> {
    let mut buf = [0u8; 16];
    if w.len() > buf.len() {
        return None;
    }
    for (i, b) in w.iter().enumerate() {
        buf[i] = b.to_ascii_lowercase();
    }
    let l = &buf[..w.len()];
    Some(match l {
        b"union" => K::Union,
        b"select" => K::Select,
        b"from" => K::From,
        b"where" | b"order" | b"group" | b"having" | b"limit" | b"procedure" | b"offset"
        | b"join" => K::Clause,
        b"insert" | b"update" | b"delete" | b"drop" | b"declare" | b"exec" | b"execute"
        | b"create" | b"alter" | b"truncate" | b"shutdown" | b"waitfor" | b"grant" | b"revoke" => {
            K::Stmt
        }
        b"case" | b"when" | b"then" | b"else" | b"end" => K::Case,
        b"like" | b"rlike" | b"regexp" | b"between" | b"is" | b"in" | b"sounds" | b"glob" => {
            K::CmpWord
        }
        b"null" | b"true" | b"false" => K::Literal,
        b"all" | b"distinct" => K::All,
        b"delay" | b"time" => K::Delay,
        b"as" => K::As,
        b"into" | b"outfile" | b"dumpfile" => K::Into,
        b"table" | b"database" | b"schema" | b"user" | b"login" | b"procedure_" => K::Table,
        _ => return None,
    })
}

fn is_bool_word(w: &[u8]) -> bool {
    w.eq_ignore_ascii_case(b"and")
        || w.eq_ignore_ascii_case(b"or")
        || w.eq_ignore_ascii_case(b"xor")
        || w.eq_ignore_ascii_case(b"not")
        || w.eq_ignore_ascii_case(b"div")
        || w.eq_ignore_ascii_case(b"mod")
}

/// Functions that only make sense in an attack: delays, out-of-band, file and
/// error-based extraction.
fn dangerous_function(w: &[u8]) -> bool {
    const F: &[&[u8]] = &[
        b"sleep",
        b"benchmark",
        b"pg_sleep",
        b"extractvalue",
        b"updatexml",
        b"load_file",
        b"xp_cmdshell",
        b"xp_dirtree",
        b"get_host_address",
        b"get_host_name",
        b"receive_message",
        b"randomblob",
        b"dbms_pipe",
        b"make_set",
        b"elt",
        b"exp",
        b"geometrycollection",
        b"polygon",
        b"multipoint",
        b"name_const",
        b"gtid_subset",
        b"json_keys",
        b"fn_varbintohexstr",
        b"pg_read_file",
        b"lo_import",
        b"sys_eval",
        b"sys_exec",
        b"utl_http",
        b"httpuritype",
        b"ctxsys",
        b"dbms_xmlgen",
        b"load_extension",
        b"openrowset",
        b"opendatasource",
    ];
    F.iter().any(|f| f.eq_ignore_ascii_case(w))
}

/// Functions and identifiers typical of injected queries (used as weaker evidence).
fn sql_function(w: &[u8]) -> bool {
    const F: &[&[u8]] = &[
        b"version",
        b"database",
        b"user",
        b"current_user",
        b"system_user",
        b"session_user",
        b"schema",
        b"current_database",
        b"current_schema",
        b"current_setting",
        b"inet_server_addr",
        b"char",
        b"chr",
        b"concat",
        b"concat_ws",
        b"group_concat",
        b"substring",
        b"substr",
        b"mid",
        b"ascii",
        b"ord",
        b"cast",
        b"convert",
        b"if",
        b"ifnull",
        b"iif",
        b"nullif",
        b"coalesce",
        b"length",
        b"len",
        b"count",
        b"hex",
        b"unhex",
        b"md5",
        b"to_char",
        b"json_extract",
        b"json_depth",
        b"rand",
        b"row",
        b"exists",
        b"case",
        b"select",
    ];
    F.iter().any(|f| f.eq_ignore_ascii_case(w))
}

fn suspicious_table(w: &[u8]) -> bool {
    const F: &[&[u8]] = &[
        b"information_schema",
        b"sysobjects",
        b"syscolumns",
        b"sysusers",
        b"syslogins",
        b"sysdatabases",
        b"sysprocesses",
        b"all_tables",
        b"user_tables",
        b"pg_catalog",
        b"pg_shadow",
        b"sqlite_master",
        b"mysql",
        b"dual",
        b"master",
        b"sys",
    ];
    F.iter().any(|f| f.eq_ignore_ascii_case(w))
}

/// Lexes `s`. With `ctx` = `Some(q)` the input is taken to start inside a
/// string opened by quote `q`: the first token is that string, up to the
/// input's first unescaped `q`. Returns false when the input never leaves the
/// string (nothing to analyse in that context).
pub(crate) fn lex(s: &[u8], ctx: Option<u8>, out: &mut Vec<Tok>) -> bool {
    out.clear();
    let mut i = 0;
    if let Some(q) = ctx {
        let mut j = 0;
        loop {
            if j >= s.len() {
                return false;
            }
            if s[j] == b'\\' {
                j += 2;
                continue;
            }
            if s[j] == q {
                if j + 1 < s.len() && s[j + 1] == q {
                    j += 2;
                    continue;
                }
                break;
            }
            j += 1;
        }
        out.push(Tok {
            t: T::Str,
            s: 0,
            e: j + 1,
        });
        i = j + 1;
    }
    while i < s.len() && out.len() < MAX_TOKENS {
        let c = s[i];
        let start = i;
        let t = match c {
            b' ' | b'\t' | b'\r' | b'\n' | 0x0b | 0x0c | 0 => {
                i += 1;
                continue;
            }
            b'\'' | b'"' => {
                let q = c;
                i += 1;
                while i < s.len() {
                    if s[i] == b'\\' {
                        i += 2;
                        continue;
                    }
                    if s[i] == q {
                        if i + 1 < s.len() && s[i + 1] == q {
                            i += 2;
                            continue;
                        }
                        break;
                    }
                    i += 1;
                }
                i = (i + 1).min(s.len());
                T::Str
            }
            b'`' => {
                i += 1;
                while i < s.len() && s[i] != b'`' {
                    i += 1;
                }
                i = (i + 1).min(s.len());
                T::Word
            }
            b'0'..=b'9' => {
                if c == b'0' && i + 1 < s.len() && (s[i + 1] == b'x' || s[i + 1] == b'X') {
                    i += 2;
                    while i < s.len() && s[i].is_ascii_hexdigit() {
                        i += 1;
                    }
                    T::Num
                } else {
                    let mut plain = true;
                    while i < s.len() && s[i].is_ascii_digit() {
                        i += 1;
                    }
                    if i < s.len() && s[i] == b'.' {
                        plain = false;
                        i += 1;
                        while i < s.len() && s[i].is_ascii_digit() {
                            i += 1;
                        }
                    }
                    if i + 1 < s.len()
                        && (s[i] == b'e' || s[i] == b'E')
                        && (s[i + 1].is_ascii_digit()
                            || ((s[i + 1] == b'-' || s[i + 1] == b'+')
                                && i + 2 < s.len()
                                && s[i + 2].is_ascii_digit()))
                    {
                        plain = false;
                        i += 2;
                        while i < s.len() && s[i].is_ascii_digit() {
                            i += 1;
                        }
                    }
                    if plain && i < s.len() && (s[i].is_ascii_alphabetic() || s[i] == b'_') {
                        while i < s.len() && (s[i].is_ascii_alphanumeric() || s[i] == b'_') {
                            i += 1;
                        }
                        T::Word
                    } else {
                        T::Num
                    }
                }
            }
            b'a'..=b'z' | b'A'..=b'Z' | b'_' | b'$' => {
                while i < s.len() && (s[i].is_ascii_alphanumeric() || s[i] == b'_' || s[i] == b'$')
                {
                    i += 1;
                }
                let w = &s[start..i];
                if is_bool_word(w) {
                    T::Bool
                } else if let Some(k) = keyword(w) {
                    T::Kw(k)
                } else {
                    T::Word
                }
            }
            b'@' => {
                i += 1;
                if i < s.len() && s[i] == b'@' {
                    i += 1;
                }
                while i < s.len() && (s[i].is_ascii_alphanumeric() || s[i] == b'_') {
                    i += 1;
                }
                T::Var
            }
            b'-' if i + 1 < s.len() && s[i + 1] == b'-' => {
                while i < s.len() && s[i] != b'\n' {
                    i += 1;
                }
                T::Comment
            }
            b'#' => {
                while i < s.len() && s[i] != b'\n' {
                    i += 1;
                }
                T::Comment
            }
            b'/' if i + 1 < s.len() && s[i + 1] == b'*' => {
                if i + 2 < s.len() && s[i + 2] == b'!' {
                    // MySQL executable comment: its content is code.
                    i += 3;
                    while i < s.len() && s[i].is_ascii_digit() {
                        i += 1;
                    }
                    continue;
                }
                i += 2;
                match memchr::memmem::find(&s[i..], b"*/") {
                    // A closed comment with more code after it separates tokens as a
                    // space does (`1'/**/OR/**/1=1`); one that ends the input is the
                    // breakout's tail (`admin'/*`) and stays a token.
                    Some(p) => {
                        i += p + 2;
                        if s[i..].iter().any(|c| !c.is_ascii_whitespace()) {
                            continue;
                        }
                    }
                    None => i = s.len(),
                }
                T::Comment
            }
            b'*' if i + 1 < s.len() && s[i + 1] == b'/' => {
                i += 2;
                continue;
            }
            b'=' | b'<' | b'>' | b'!' => {
                i += 1;
                while i < s.len() && matches!(s[i], b'=' | b'<' | b'>') && i - start < 3 {
                    i += 1;
                }
                if c == b'!' && i == start + 1 {
                    T::Arith
                } else {
                    T::Cmp
                }
            }
            b'|' => {
                i += 1;
                if i < s.len() && s[i] == b'|' {
                    i += 1;
                    T::Concat
                } else {
                    T::Arith
                }
            }
            b'&' => {
                i += 1;
                if i < s.len() && s[i] == b'&' {
                    i += 1;
                    T::Bool
                } else {
                    T::Arith
                }
            }
            b'+' | b'-' | b'*' | b'/' | b'%' | b'^' | b'~' => {
                i += 1;
                T::Arith
            }
            b':' => {
                i += 1;
                if i < s.len() && (s[i] == b'=' || s[i] == b':') {
                    i += 1;
                }
                T::Other
            }
            b'(' => {
                i += 1;
                T::LParen
            }
            b')' => {
                i += 1;
                T::RParen
            }
            b',' => {
                i += 1;
                T::Comma
            }
            b';' => {
                i += 1;
                T::Semi
            }
            b'.' => {
                i += 1;
                T::Dot
            }
            _ => {
                i += 1;
                T::Other
            }
        };
        out.push(Tok { t, s: start, e: i });
    }
    true
}

struct View<'a> {
    s: &'a [u8],
    toks: Vec<Tok>,
}

impl View<'_> {
    fn word(&self, i: usize) -> &[u8] {
        let t = self.toks[i];
        &self.s[t.s..t.e]
    }
    fn t(&self, i: usize) -> Option<T> {
        self.toks.get(i).map(|t| t.t)
    }
    fn is_call(&self, i: usize) -> bool {
        matches!(self.t(i), Some(T::Word | T::Kw(_))) && self.t(i + 1) == Some(T::LParen)
    }
    /// An operand: literal, identifier, variable, function call or parenthesised
    /// expression. Returns the index after it.
    fn operand(&self, i: usize) -> Option<usize> {
        let mut i = i;
        while matches!(self.t(i), Some(T::Arith)) {
            i += 1;
        }
        match self.t(i)? {
            T::Str | T::Num | T::Var | T::Kw(K::Literal) => Some(i + 1),
            T::Word | T::Kw(_) => {
                if self.is_call(i) {
                    self.skip_parens(i + 1)
                } else {
                    let mut j = i + 1;
                    while self.t(j) == Some(T::Dot)
                        && matches!(self.t(j + 1), Some(T::Word | T::Kw(_)))
                    {
                        j += 2;
                    }
                    // a call by a qualified name: `schema.package.function(...)`
                    if j > i + 1 && self.t(j) == Some(T::LParen) {
                        return self.skip_parens(j);
                    }
                    Some(j)
                }
            }
            T::LParen => self.skip_parens(i),
            _ => None,
        }
    }
    fn skip_parens(&self, i: usize) -> Option<usize> {
        let mut depth = 0usize;
        let mut j = i;
        while j < self.toks.len() {
            match self.toks[j].t {
                T::LParen => depth += 1,
                T::RParen => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        return Some(j + 1);
                    }
                }
                _ => {}
            }
            j += 1;
        }
        Some(j)
    }
    fn end_or_comment(&self, i: usize) -> bool {
        match self.t(i) {
            None => true,
            Some(T::Comment | T::Semi) => true,
            Some(T::Str) => self.toks[i].e == self.s.len() && i + 1 == self.toks.len(),
            _ => false,
        }
    }
    fn cmp_at(&self, i: usize) -> bool {
        matches!(self.t(i), Some(T::Cmp | T::Kw(K::CmpWord)))
    }
    /// The end of a list of column numbers starting at `i` (`1,2,3`).
    fn numbers_end(&self, mut i: usize) -> usize {
        while self.t(i) == Some(T::Num) {
            i += 1;
            if self.t(i) != Some(T::Comma) || self.t(i + 1) != Some(T::Num) {
                break;
            }
            i += 1;
        }
        i
    }
    fn next_non_comment(&self, mut i: usize) -> usize {
        while self.t(i) == Some(T::Comment) {
            i += 1;
        }
        i
    }
}

/// Evaluates the grammar rules on one lexed context; returns (confidence, token range).
fn rules(v: &View<'_>, ctx: Option<u8>) -> Option<(u8, usize, usize)> {
    let n = v.toks.len();
    let mut best: Option<(u8, usize, usize)> = None;
    let take = |c: u8, a: usize, b: usize, best: &mut Option<(u8, usize, usize)>| {
        if best.is_none_or(|x| x.0 < c) {
            *best = Some((c, a, b));
        }
    };
    // Did the input leave its context? Quote contexts always have (lex checked);
    // the bare context counts when it starts with a number or closing paren.
    let breakout = ctx.is_some()
        || matches!(v.t(0), Some(T::Num | T::RParen))
        || (v.t(0) == Some(T::Word) && matches!(v.t(1), Some(T::RParen)));
    let start = if ctx.is_some() { 1 } else { 0 };
    for i in 0..n {
        match v.toks[i].t {
            T::Kw(K::Union) => {
                let mut j = v.next_non_comment(i + 1);
                if v.t(j) == Some(T::Kw(K::All)) {
                    j = v.next_non_comment(j + 1);
                }
                while v.t(j) == Some(T::LParen) {
                    j += 1;
                }
                if v.t(j) == Some(T::Kw(K::Select)) {
                    // `union select` with nothing selected is a phrase, not a query
                    let mut k = v.next_non_comment(j + 1);
                    while v.t(k) == Some(T::Arith) && matches!(v.word(k), b"+" | b"-") {
                        k += 1;
                    }
                    let listed = matches!(
                        v.t(k),
                        Some(
                            T::Num
                                | T::Str
                                | T::Word
                                | T::Var
                                | T::LParen
                                | T::Kw(K::Literal | K::All | K::Case | K::Table)
                        )
                    ) || (v.t(k) == Some(T::Arith) && v.word(k) == b"*");
                    let c = if listed { 95 } else { 50 };
                    take(c, i, (j + 1).min(n), &mut best);
                }
            }
            T::Kw(K::Select) => {
                if let Some(end) = select_shape(v, i) {
                    // Inside an expression or after another token it is injected; a
                    // statement on its own needs attack evidence (system tables,
                    // extraction functions, subqueries, CASE) - people search for SQL.
                    let prev = if i > start { v.t(i - 1) } else { None };
                    let in_expr = matches!(
                        prev,
                        Some(
                            T::LParen
                                | T::Semi
                                | T::Kw(K::Union | K::All)
                                | T::Bool
                                | T::Concat
                                | T::Comment
                        )
                    );
                    let c = if in_expr || breakout || statement_evidence(v, i) {
                        85
                    } else {
                        55
                    };
                    take(c, i, end, &mut best);
                }
            }
            // T-SQL needs no `;` between statements: a delay or a procedure call may
            // follow the parenthesis that closed the query's own expression
            // (`') waitfor delay '0:0:20'--`, `,NULL) exec master..xp_cmdshell 'id'`)
            // A delay with its duration is T-SQL wherever it stands: after a number
            // (`1 waitfor delay '0:0:5'--`) or a condition (`if 1=1 waitfor delay ...`)
            // T-SQL's dynamic SQL: a string or hex literal run from a variable
            // (`0x7761...00 exec(@s)`, `set @q=...; exec(@q)`)
            T::Kw(K::Stmt)
                if (v.word(i).eq_ignore_ascii_case(b"exec")
                    || v.word(i).eq_ignore_ascii_case(b"execute"))
                    && v.t(i + 1) == Some(T::LParen)
                    && v.t(i + 2) == Some(T::Var) =>
            {
                take(80, i, (i + 3).min(n), &mut best);
            }
            // T-SQL's conditional statement: `IF(7423=7424) SELECT 7423 ELSE DROP ...`
            // (sqlmap's test for stacked queries)
            T::Word
                if i == start
                    && v.word(i).eq_ignore_ascii_case(b"if")
                    && v.is_call(i)
                    && v.skip_parens(i + 1)
                        .is_some_and(|e| matches!(v.t(e), Some(T::Kw(K::Select | K::Stmt))))
                    && (i + 2..n)
                        .take_while(|&k| v.t(k) != Some(T::RParen))
                        .any(|k| v.cmp_at(k)) =>
            {
                take(80, i, (i + 2).min(n), &mut best);
            }
            T::Kw(K::Stmt) if i > 0 && timed_waitfor(v, i) => {
                take(if breakout { 85 } else { 80 }, i, (i + 3).min(n), &mut best);
            }
            T::Kw(K::Stmt) if i > 0 && v.t(i - 1) == Some(T::RParen) && unseparated_tsql(v, i) => {
                take(if breakout { 85 } else { 80 }, i, (i + 2).min(n), &mut best);
            }
            T::Kw(K::Stmt) if i == start || (i > 0 && v.t(i - 1) == Some(T::Semi)) => {
                let w = v.word(i).to_ascii_lowercase();
                let nx = v.t(i + 1);
                let strong = match w.as_slice() {
                    b"declare" => nx == Some(T::Var),
                    b"exec" | b"execute" => {
                        // `exec @q`, `exec(@q)`, `exec('select ...')`; not `exec (executive)`
                        nx == Some(T::Var)
                            || (nx == Some(T::LParen)
                                && matches!(v.t(i + 2), Some(T::Var | T::Str)))
                            || (matches!(nx, Some(T::Word))
                                && (v.word(i + 1).len() > 3
                                    && (v.word(i + 1)[..3].eq_ignore_ascii_case(b"xp_")
                                        || v.word(i + 1)[..3].eq_ignore_ascii_case(b"sp_")
                                        || v.word(i + 1).eq_ignore_ascii_case(b"master"))))
                    }
                    b"waitfor" => nx == Some(T::Kw(K::Delay)),
                    b"drop" | b"create" | b"truncate" | b"alter" => nx == Some(T::Kw(K::Table)),
                    b"shutdown" => v.end_or_comment(i + 1),
                    b"insert" => nx == Some(T::Kw(K::Into)),
                    b"delete" => nx == Some(T::Kw(K::From)),
                    b"update" => {
                        nx == Some(T::Word)
                            && v.t(i + 2) == Some(T::Word)
                            && v.word(i + 2).eq_ignore_ascii_case(b"set")
                    }
                    _ => false,
                };
                let stacked = i > 0 && v.t(i - 1) == Some(T::Semi);
                if strong {
                    take(
                        if stacked || breakout { 90 } else { 75 },
                        i,
                        (i + 2).min(n),
                        &mut best,
                    );
                }
            }
            T::Word | T::Kw(_) if v.is_call(i) && dangerous_function(v.word(i)) => {
                let prev = if i == 0 { None } else { v.t(i - 1) };
                let ctxok = i == 0
                    || matches!(
                        prev,
                        Some(
                            T::Bool
                                | T::Concat
                                | T::Arith
                                | T::Cmp
                                | T::LParen
                                | T::Comma
                                | T::Semi
                                | T::Kw(_)
                                | T::Dot
                        )
                    );
                // Require a plausible argument: number, string, expression.
                let arg = v.t(i + 2);
                if ctxok
                    && matches!(
                        arg,
                        Some(
                            T::Num
                                | T::Str
                                | T::Word
                                | T::Kw(_)
                                | T::LParen
                                | T::Var
                                | T::Arith
                                | T::RParen
                        )
                    )
                {
                    take(if breakout { 85 } else { 70 }, i, (i + 2).min(n), &mut best);
                }
            }
            _ => {}
        }
    }
    if ctx.is_none() {
        // a fragment meant to be appended to a value, sent as the whole value
        // (` OR 1=1#`, ` AND 1=0-- `, ` HAVING 1=1#`, ` ORDER BY 3--`): no text
        // starts with a boolean operator or a clause and then a comparison
        if let Some(e) = leading_fragment(v) {
            take(70, 0, e.min(n), &mut best);
        }
    }
    if breakout {
        // Skip the breakout prefix: the opening string / number / identifier and
        // closing parentheses.
        let mut j = if ctx.is_some() { 1 } else { 1.min(n) };
        while v.t(j) == Some(T::RParen) {
            j += 1;
        }
        let after_paren = j > 1 || (ctx.is_none() && v.t(0) == Some(T::RParen));
        match v.t(j) {
            Some(T::Bool) => {
                let k = j + 1;
                // the comparison may open parentheses first: `') or ('1'='1'--`
                let mut first = k;
                while v.t(first) == Some(T::LParen) {
                    first += 1;
                }
                // ' OR 1=1 / ' AND 'a'='a / 1 AND sleep(5)
                if let Some(a) = v.operand(first) {
                    if v.cmp_at(a) {
                        let mut b = a + 1;
                        if v.t(b) == Some(T::Kw(K::CmpWord)) {
                            b += 1;
                        }
                        if let Some(e) = v.operand(b) {
                            take(85, 0, e.min(n), &mut best);
                        } else if b >= n || v.t(b) == Some(T::Comment) {
                            // `' or ''='`: the closing quote of the context ends it.
                            take(80, 0, n, &mut best);
                        }
                    } else if v.end_or_comment(a)
                        && matches!(v.t(k), Some(T::Num | T::Str | T::Kw(K::Literal)))
                        && (ctx.is_some() || v.t(a) == Some(T::Comment))
                    {
                        // `' or 1--`, `' or true#`
                        take(80, 0, a.min(n), &mut best);
                    } else if v.t(a) == Some(T::Bool) || v.t(a) == Some(T::Concat) {
                        if let Some(b) = v.operand(a + 1) {
                            if v.cmp_at(b) {
                                take(80, 0, b.min(n), &mut best);
                            }
                        }
                    }
                }
                if v.is_call(k) && (dangerous_function(v.word(k)) || sql_function(v.word(k))) {
                    take(80, 0, (k + 2).min(n), &mut best);
                }
                if v.t(k) == Some(T::LParen) && v.t(k + 1) == Some(T::Kw(K::Select)) {
                    take(90, 0, (k + 2).min(n), &mut best);
                }
                // a conditional answer: `' and case when 1=1 then 1 else json('') end`
                if v.t(k) == Some(T::Kw(K::Case))
                    && v.word(k).eq_ignore_ascii_case(b"case")
                    && v.t(k + 1) == Some(T::Kw(K::Case))
                    && v.word(k + 1).eq_ignore_ascii_case(b"when")
                {
                    take(85, 0, (k + 2).min(n), &mut best);
                }
            }
            Some(T::Concat | T::Arith | T::Cmp) if ctx.is_some() || after_paren => {
                let k = j + 1;
                // `'='`, `1'='1`: the whole value closes the string, compares it with a
                // string the query's own quote closes (the login bypass)
                if ctx.is_some()
                    && j == 1
                    && k + 1 == n
                    && v.word(j) == b"="
                    && v.t(k) == Some(T::Str)
                    && v.toks[k].e == v.s.len()
                {
                    take(75, 0, n, &mut best);
                }
                let is_fn =
                    v.is_call(k) && (dangerous_function(v.word(k)) || sql_function(v.word(k)));
                let sub = v.t(k) == Some(T::LParen) && v.t(k + 1) == Some(T::Kw(K::Select));
                if is_fn || sub {
                    take(85, 0, (k + 2).min(n), &mut best);
                }
                // the string broken, a function called, the string joined again:
                // `' || myapp.adduser('admin', 'pw') || '` (Oracle's concatenation)
                if ctx.is_some() && v.t(j) == Some(T::Concat) {
                    if let Some(e) = v.operand(k) {
                        let called = (k..e).any(|x| v.t(x) == Some(T::LParen));
                        if called && v.t(e) == Some(T::Concat) {
                            take(80, 0, (e + 1).min(n), &mut best);
                        }
                    }
                }
                // `x' || 2=1e1union`-style tautologies behind an operator
                if let Some(a) = v.operand(k) {
                    if v.cmp_at(a) && v.operand(a + 1).is_some() && ctx.is_some() {
                        let tail = v.operand(a + 1).unwrap_or(n);
                        if v.end_or_comment(tail) || matches!(v.t(tail), Some(T::Bool | T::Kw(_))) {
                            take(75, 0, tail.min(n), &mut best);
                        }
                    }
                }
            }
            Some(T::Comment) if ctx.is_some() && j + 1 == n => {
                let cm = v.toks[j];
                let text = &v.s[cm.s..cm.e];
                // admin'-- , admin'#, admin')/*
                if !text.starts_with(b"/*") || text.ends_with(b"*/") {
                    take(70, 0, n, &mut best);
                }
            }
            Some(T::Semi) if j + 1 < n => {
                let k = j + 1;
                if matches!(v.t(k), Some(T::Kw(K::Stmt | K::Select))) {
                    take(75, 0, (k + 1).min(n), &mut best);
                }
            }
            Some(T::Kw(K::From)) if after_paren || ctx.is_some() => {
                if matches!(v.t(j + 1), Some(T::Word | T::Str)) {
                    take(80, 0, (j + 2).min(n), &mut best);
                }
            }
            Some(T::Kw(K::Clause)) => {
                // `1 order by 3--`, `') having 1=1`, `1) where ...`
                let w = v.word(j);
                let by = v.t(j + 1) == Some(T::Word) && v.word(j + 1).eq_ignore_ascii_case(b"by");
                let tail_ok = if w.eq_ignore_ascii_case(b"order")
                    || w.eq_ignore_ascii_case(b"group")
                {
                    // by a column number, or by a column name when a comment cuts the
                    // query's rest off or a HAVING test follows (`' group by x having 1=1--`)
                    let having = |h: usize| {
                        v.t(h) == Some(T::Kw(K::Clause))
                            && v.word(h).eq_ignore_ascii_case(b"having")
                            && v.operand(h + 1).is_some_and(|a| v.cmp_at(a))
                    };
                    by && match v.t(j + 2) {
                        Some(T::Num) => {
                            let e = v.numbers_end(j + 2);
                            v.end_or_comment(e) || having(e)
                        }
                        Some(T::Word) => v
                            .operand(j + 2)
                            .is_some_and(|e| v.t(e) == Some(T::Comment) || having(e)),
                        _ => false,
                    }
                } else if w.eq_ignore_ascii_case(b"where") || w.eq_ignore_ascii_case(b"having") {
                    v.operand(j + 1).is_some_and(|a| v.cmp_at(a))
                } else {
                    w.eq_ignore_ascii_case(b"procedure")
                };
                if tail_ok && (ctx.is_some() || after_paren || v.t(0) == Some(T::Num)) {
                    take(80, 0, (j + 2).min(n), &mut best);
                }
            }
            Some(T::Kw(K::Union)) => {}
            Some(T::Kw(K::Into))
                if ctx.is_some()
                    && v.word(j).eq_ignore_ascii_case(b"into")
                    && matches!(v.t(j + 1), Some(T::Kw(K::Into))) =>
            {
                take(85, 0, (j + 2).min(n), &mut best);
            }
            _ => {}
        }
    }
    best
}

/// The end of a value that opens with `OR` / `AND` / `WHERE` / `HAVING` and a
/// comparison that the value's end, a comment or another boolean operator closes, or
/// with `ORDER BY` / `GROUP BY` a column number that a comment closes.
fn leading_fragment(v: &View<'_>) -> Option<usize> {
    let clause = |w: &[u8]| v.t(0) == Some(T::Kw(K::Clause)) && v.word(0).eq_ignore_ascii_case(w);
    if v.t(0) == Some(T::Bool) || clause(b"where") || clause(b"having") {
        let a = v.operand(1)?;
        let e = v.operand(a + 1).filter(|_| v.cmp_at(a))?;
        return (v.end_or_comment(e) || v.t(e) == Some(T::Bool)).then_some(e);
    }
    let by = v.t(1) == Some(T::Word) && v.word(1).eq_ignore_ascii_case(b"by");
    if (clause(b"order") || clause(b"group")) && by {
        // a column number, or a delay to time the answer by (` ORDER BY SLEEP(5)#`)
        let end = match v.t(2) {
            Some(T::Num) => Some(v.numbers_end(2)),
            Some(T::Word | T::Kw(_)) if v.is_call(2) && dangerous_function(v.word(2)) => {
                v.skip_parens(3)
            }
            _ => None,
        }?;
        return matches!(v.t(end), Some(T::Comment)).then_some(end + 1);
    }
    None
}

/// Attack evidence inside a stand-alone statement starting at `i`.
fn statement_evidence(v: &View<'_>, i: usize) -> bool {
    let n = v.toks.len();
    for k in i + 1..n {
        match v.t(k) {
            Some(T::Kw(K::Select | K::Case | K::Union | K::Delay)) | Some(T::Var) => return true,
            // a query that writes a file on the database server
            Some(T::Kw(K::Into))
                if v.word(k).eq_ignore_ascii_case(b"outfile")
                    || v.word(k).eq_ignore_ascii_case(b"dumpfile") =>
            {
                return true
            }
            Some(T::Word | T::Kw(_)) => {
                let w = v.word(k);
                if suspicious_table(w)
                    || w.eq_ignore_ascii_case(b"password")
                    || w.eq_ignore_ascii_case(b"passwd")
                {
                    return true;
                }
                if v.is_call(k) && (dangerous_function(w) || sql_function(w)) {
                    return true;
                }
                if niladic_user(w) {
                    return true;
                }
            }
            _ => {}
        }
    }
    false
}

/// A T-SQL delay or extended-procedure call at `i` (`waitfor delay`, `exec xp_...`,
/// `exec master..xp_...`).
fn unseparated_tsql(v: &View<'_>, i: usize) -> bool {
    let w = v.word(i);
    if w.eq_ignore_ascii_case(b"waitfor") {
        return v.t(i + 1) == Some(T::Kw(K::Delay));
    }
    let exec = w.eq_ignore_ascii_case(b"exec") || w.eq_ignore_ascii_case(b"execute");
    exec && v.t(i + 1) == Some(T::Word) && {
        let p = v.word(i + 1);
        p.len() > 3 && (p[..3].eq_ignore_ascii_case(b"xp_") || p.eq_ignore_ascii_case(b"master"))
    }
}

/// `waitfor delay` and a duration (`'0:0:5'`) at `i`: what a time-based probe of
/// MSSQL sends; a sentence about waiting has no quoted clock time after it.
fn timed_waitfor(v: &View<'_>, i: usize) -> bool {
    v.word(i).eq_ignore_ascii_case(b"waitfor")
        && v.t(i + 1) == Some(T::Kw(K::Delay))
        && v.t(i + 2) == Some(T::Str)
        && {
            let t = v.toks[i + 2];
            let raw = &v.s[t.s..t.e];
            let lit = raw
                .strip_prefix(b"'")
                .or(raw.strip_prefix(b"\""))
                .unwrap_or(raw);
            let lit = lit
                .strip_suffix(b"'")
                .or(lit.strip_suffix(b"\""))
                .unwrap_or(lit);
            !lit.is_empty()
                && lit.contains(&b':')
                && lit
                    .iter()
                    .all(|c| c.is_ascii_digit() || matches!(c, b':' | b'.'))
        }
}

/// SQL's niladic user functions, written without parentheses (`select session_user;`).
fn niladic_user(w: &[u8]) -> bool {
    [&b"session_user"[..], b"current_user", b"system_user"]
        .iter()
        .any(|f| w.eq_ignore_ascii_case(f))
}

/// `SELECT` followed by a select list that only SQL produces.
fn select_shape(v: &View<'_>, i: usize) -> Option<usize> {
    let n = v.toks.len();
    let j = v.next_non_comment(i + 1);
    match v.t(j)? {
        T::Arith if v.word(j) == b"*" => {
            let k = v.next_non_comment(j + 1);
            if v.t(k) == Some(T::Kw(K::From)) {
                return Some((k + 1).min(n));
            }
            None
        }
        T::LParen => Some(j + 1),
        T::Var => Some(j + 1),
        T::Kw(K::Case) => Some(j + 1),
        T::Kw(K::All) => Some(j + 1),
        T::Word | T::Kw(_) if v.is_call(j) => Some(j + 2),
        T::Str | T::Num | T::Kw(K::Literal) => {
            let k = j + 1;
            match v.t(k) {
                None if i > 0 => Some(k),
                Some(T::Comma | T::Kw(K::From | K::Clause | K::Into) | T::Comment | T::Semi) => {
                    Some(k)
                }
                Some(T::RParen) => Some(k),
                _ => None,
            }
        }
        T::Word | T::Kw(_)
            if niladic_user(v.word(j))
                && (v.end_or_comment(j + 1) || v.t(j + 1) == Some(T::Kw(K::From))) =>
        {
            Some(j + 1)
        }
        T::Word | T::Kw(_) => {
            // select a, b from t  /  select a from t  /  select t.a from t
            let mut k = v.operand(j)?;
            let mut cols = 1;
            while v.t(k) == Some(T::Comma) {
                k = v.operand(k + 1)?;
                cols += 1;
            }
            if v.t(k) == Some(T::Kw(K::As)) {
                k += 2;
            }
            if v.t(k) == Some(T::Kw(K::From)) {
                let t = k + 1;
                let table_ok = match v.t(t) {
                    Some(T::Word | T::Kw(_)) => {
                        let w = v.word(t);
                        suspicious_table(w)
                            || cols > 1
                            || w.contains(&b'_')
                            || v.t(t + 1).is_none()
                            || matches!(
                                v.t(t + 1),
                                Some(
                                    T::Dot
                                        | T::Kw(K::Clause | K::Union)
                                        | T::Comment
                                        | T::Semi
                                        | T::RParen
                                )
                            )
                    }
                    Some(T::LParen) => true,
                    _ => false,
                };
                if table_ok {
                    return Some((t + 1).min(n));
                }
            }
            None
        }
        _ => None,
    }
}

/// Runs the SQL detector on `s`.
pub fn detect(s: &str) -> Option<Hit> {
    let b = s.as_bytes();
    let mut best: Option<Hit> = None;
    let mut toks = Vec::new();
    for ctx in [None, Some(b'\''), Some(b'"')] {
        if let Some(q) = ctx {
            if memchr::memchr(q, b).is_none() {
                continue;
            }
        }
        if !lex(b, ctx, &mut toks) {
            continue;
        }
        let view = View {
            s: b,
            toks: std::mem::take(&mut toks),
        };
        if let Some((c, a, e)) = rules(&view, ctx) {
            if best.as_ref().is_none_or(|h| h.confidence < c) {
                let fs = view.toks.get(a).map(|t| t.s).unwrap_or(0);
                let fe = if e == 0 {
                    b.len()
                } else {
                    view.toks.get(e - 1).map(|t| t.e).unwrap_or(b.len())
                };
                best = Some(Hit::new(Attack::Sqli, c, s, fs, fe.max(fs)));
            }
        }
        toks = view.toks;
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hit(s: &str) -> bool {
        detect(s).is_some_and(|h| h.confidence >= 60)
    }

    #[test]
    fn attacks() {
        for a in [
            "1 WAITFOR DELAY '0:0:5'--",
            "IF(7423=7424) SELECT 7423 ELSE DROP FUNCTION xcjl--",
            "0x77616974666F722064656C61792027303A303A31302700 exec(@s)",
            "IF 1=1 WAITFOR DELAY '0:0:5' ELSE WAITFOR DELAY '0:0:0';",
            "' AND CASE WHEN 1=1 THEN 1 ELSE json('') END AND 'A'='A",
            "1 AND CASE WHEN 1=1 THEN 1 ELSE 0 END",
            "SELECT load_extension('/tmp/x.so')",
            "SELECT '<?php system($_GET[c]); ?>' INTO OUTFILE '/var/www/html/s.php'",
            "1;SELECT * FROM OPENROWSET(BULK 'C:\\x', SINGLE_CLOB) AS x",
            " OR 1=1#",
            " AND 1=0-- ",
            " OR x=y",
            " HAVING 1=1#",
            " WHERE 1=1 AND 1=0",
            " ORDER BY 3--",
            " ORDER BY SLEEP(5)#",
            "') waitfor delay '0:0:20' --",
            ",NULL) waitfor delay '0:0:20' /*",
            "1) exec master..xp_cmdshell 'ping x'--",
            "1' ORDER BY 1,2--+",
            "1 GROUP BY 1,2,3#",
            "' || myappadmin.adduser('admin', 'newpass') || '",
            "select session_user;",
            "select * from sysusers",
            " AND 7300=7300 AND 'pKlZ'='pKlZ",
            "1' or '1'='1",
            "' or ''='",
            "1 and 1=1",
            "x' UNION ALL SELECT null,version()-- ",
            "0' || 2=1e1union /*!select*/ 1, 2#",
            "admin'--",
            "1;DROP TABLE users",
            "SELECT * FROM all_tables",
            "x'||pg_sleep(10)--",
            "declare @p varchar(1024);set @p=1",
            "1) AND sleep(5",
            "SELECT CASE WHEN (1=1) THEN 1 ELSE 0 END FROM dual",
            "0.05))) FROM \"X\" where 1=1",
            "1 order by 3--",
            "1 = (SELECT 1)",
            "' UNION SELECT username||'~'||password FROM users--",
            // closed comments as spaces between the tokens
            "1'/**/OR/**/1=1--",
            "1' OR/*x*/1=1--",
            "1'/**/and/**/'a'='a",
            // the string-equals-string login bypass
            "'='",
            "1'='1",
            // grouping by a column name: with a HAVING test, or the query's rest cut off
            "' GROUP BY x HAVING 1=1--",
            "') group by users.id having 1=1#",
            "1 group by 2 having 1=1",
            "' order by username--",
            // the comparison behind opening parentheses
            "admin') or ('1'='1'--",
            "admin\") or (\"1\"=\"1\"#",
            "x' and (1=1)#",
            // a stand-alone statement with a system information function
            "select current_setting('port');",
        ] {
            assert!(hit(a), "missed {a}");
        }
    }

    #[test]
    fn benign() {
        for b in [
            "union was a great select",
            "please waitfor delay notices",
            "if (you) select blue, we ship",
            "exec (executive) summary",
            "select 'gift wrap' into the cart",
            "in case when it rains, then what",
            "'Just in case' and case when it rains",
            "D'or 1st parfume",
            "1) a-b=c",
            "john+or@var.es",
            "DEAR FINN,--I think it would do; copy should reach us second post",
            "I'd like to select one from the list, please",
            "O'Reilly and Sons",
            "it's 5 o'clock and we're late",
            "rock 'n' roll",
            "5 or 6 people",
            "Select your size from the menu below",
            "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
            "see /* the docs */ for more",
            "int main() { /* comment */ return 0; }",
            "price 10/*per unit*/ or less",
            "it's = it's",
            "O'Neil=1",
            "a'=b",
            "x = 'y'",
            "results group by country",
            "'80s hits order by year -- newest first",
            "sort order by name, then group by team",
            "'group by' and 'order by' are SQL clauses",
            "Rock 'n' (roll) or (blues)",
            "it's (mostly) or (partly) true",
            "or more",
            "and then x = y, roughly",
            "Order by 3 pm -- thanks",
            "where to eat = the question",
            "AND/OR logic",
            "order by sleep(8) hours -- said the doctor",
            "'a' || 'b'",
            "x' || f(y)",
            "select the session user from the list",
            "(for later) waitfor the delay",
            "(draft) execute the plan",
            "order by 1, 2 or 3",
            "sorted: 2 by 2, 4 by 4",
        ] {
            assert!(!hit(b), "false positive on {b}: {:?}", detect(b));
        }
    }
}
