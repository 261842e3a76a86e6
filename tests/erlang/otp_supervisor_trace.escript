#!/usr/bin/env escript
%%! -noshell
%% Runs supervision trees on the REAL Erlang/OTP `supervisor` and prints what happened.
%%
%% stdin: one Erlang term, a list of cases `{Tree, Plans, Steps}`, followed by a dot.
%%   Tree  = {sup, Id, Flags, Restart, Significant, [Tree]}
%%         | {worker, Id, Restart, Shutdown, Significant}       (Shutdown: brutal_kill|infinity|ms)
%%   Plans = [{Path, [ok | ignore | {error, Reason}]}]    successive start results of a worker
%%   Steps = [{crash, Path, Reason} | {stop_sup, Path, Reason} | {kill_sup, Path} | {sleep, Ms}
%%            | {call, SupPath, terminate_child | restart_child | delete_child, Id}
%%            | {call, SupPath, start_child, WorkerTree}]
%% Ids, paths and reasons are atoms ('rl/s/x'). After the steps the root is stopped.
%% stdout: one JSON array per case, in causal order, of
%%   ["sup_start", Path] | ["start", Path, Outcome] | ["exit", Path, Reason]
%%   | ["reply", SupPath, Op, Outcome] | ["root_init_failed", Reason]
%% (atoms and binaries become strings, tuples and lists become arrays).
%%
%% Ordering: every record carries {monotonic_time(nanosecond), unique_integer([monotonic])}, the
%% same stamp `strict_monotonic_timestamp` puts on trace messages, so a worker's start (stamped in
%% its init/1) and a process exit (stamped by the `procs` trace as it dies, before its links fire)
%% sort causally. The exit of a process whose start failed or was ignored is not reported: in
%% OTP 25 gen_server acks the failure *before* it exits, so that exit races the supervisor.
-module(otp_supervisor_trace).
-mode(compile).
-export([main/1, start_worker/1, start_sup/2]).
-export([init/1, handle_call/3, handle_cast/2, handle_info/2, terminate/2, code_change/3]).

main(_) ->
    logger:set_primary_config(level, none),  % crash reports would interleave with the JSON
    Cases = read_cases(),
    ets:new(otpst, [named_table, public]),
    process_flag(trap_exit, true),
    %% Raw /dev/stdout, not io: the escript's io server is gone once stdin reached eof.
    {ok, Out} = file:open("/dev/stdout", [write, raw, binary]),
    lists:foreach(fun(Case) -> ok = file:write(Out, [json(run_case(Case)), $\n]) end, Cases),
    ok = file:close(Out),
    halt(0).

read_cases() ->
    Text = unicode:characters_to_list(read_all([])),
    {ok, Tokens, _} = erl_scan:string(Text),
    {ok, Cases} = erl_parse:parse_term(Tokens),
    Cases.

read_all(Acc) ->
    case io:get_chars(standard_io, '', 65536) of
        eof -> lists:reverse(Acc);
        Data -> read_all([Data | Acc])
    end.

%% ---- one case ---------------------------------------------------------------------------------

run_case({Tree, Plans, Steps}) ->
    ets:delete_all_objects(otpst),
    ets:insert(otpst, {ctl, self()}),
    [ets:insert(otpst, {{plan, P}, L}) || {P, L} <- Plans],
    erlang:trace(new_processes, true, [procs, strict_monotonic_timestamp, {tracer, self()}]),
    RootPath = element(2, Tree),
    case supervisor:start_link(?MODULE, {sup, RootPath, Tree}) of
        {ok, Root} ->
            settle(),
            run_steps(Root, Steps),
            case is_process_alive(Root) of
                true -> exit(Root, shutdown), receive {'EXIT', Root, _} -> ok end;
                false -> ok
            end,
            settle();
        {error, Reason} ->
            record({root_init_failed, Reason}, none)
    end,
    erlang:trace(new_processes, false, [procs]),
    Ref = erlang:trace_delivered(all),
    receive {trace_delivered, all, Ref} -> ok end,
    collect().

run_steps(_Root, []) -> ok;
run_steps(Root, [Step | Steps]) ->
    case is_process_alive(Root) of
        true -> step(Step), settle(), run_steps(Root, Steps);
        false -> ok
    end.

step({sleep, Ms}) ->
    timer:sleep(Ms);
step({crash, Path, Reason}) ->
    with_pid(Path, fun(Pid) ->
        Mon = monitor(process, Pid),
        case Reason of
            killed -> exit(Pid, kill);
            _ -> gen_server:cast(Pid, {stop, Reason})
        end,
        receive {'DOWN', Mon, process, Pid, _} -> ok end
    end);
%% Steps for a supervisor act only on one: a worker may have taken over the path of one that is
%% gone (a dynamic child started with its id), and otpmesh's model leaves a worker alone there.
step({stop_sup, Path, Reason}) ->
    with_sup(Path, fun(Pid) -> catch sys:terminate(Pid, Reason) end);
step({kill_sup, Path}) ->
    with_sup(Path, fun(Pid) ->
        Mon = monitor(process, Pid),
        exit(Pid, kill),
        receive {'DOWN', Mon, process, Pid, _} -> ok end
    end);
step({call, Sup, Op, Arg}) ->
    with_sup(Sup, fun(Pid) ->
        record({reply, Sup, Op, outcome(Op, call(Pid, Sup, Op, Arg))}, none)
    end).

with_sup(Path, Fun) ->
    with_pid(Path, fun(Pid) ->
        case ets:lookup(otpst, {sup, Path}) of
            [{_, Pid}] -> Fun(Pid);
            _ -> ok
        end
    end).

call(Pid, _Sup, terminate_child, Id) -> supervisor:terminate_child(Pid, Id);
call(Pid, _Sup, restart_child, Id) -> supervisor:restart_child(Pid, Id);
call(Pid, _Sup, delete_child, Id) -> supervisor:delete_child(Pid, Id);
call(Pid, Sup, start_child, Spec) -> supervisor:start_child(Pid, child_spec(Sup, Spec)).

%% Pids and child records are not comparable across runs: keep what otpmesh's Outcome names.
outcome(_, ok) -> ok;
outcome(_, {ok, undefined}) -> ignored;
outcome(_, {ok, Pid}) when is_pid(Pid) -> ok;
outcome(_, {error, {already_started, _}}) -> already_started;
%% The supervisor's own refusals are atoms; any other {error, Reason} is a failed (re)start, even
%% when the child's start returned an atom reason ({error, nope} from restart_child).
outcome(_, {error, Refusal}) when Refusal =:= running; Refusal =:= restarting;
                                  Refusal =:= not_found; Refusal =:= already_present;
                                  Refusal =:= simple_one_for_one -> Refusal;
outcome(start_child, {error, {Reason, _ChildRecord}}) -> {start_error, Reason};
outcome(_, {error, Reason}) -> {start_error, Reason}.

with_pid(Path, Fun) ->
    case ets:lookup(otpst, {pid, Path}) of
        [{_, Pid}] ->
            case is_process_alive(Pid) of
                true -> Fun(Pid), ok;
                false -> ok
            end;
        [] -> ok
    end.

%% The tree has settled when three looks in a row, 2 ms apart, see the same processes and no new
%% records or trace messages. A look calls which_children on every live supervisor, which waits
%% for that supervisor to finish what it is doing.
settle() -> settle(none, 0).
settle(_Prev, 3) -> ok;
settle(Prev, Same) ->
    timer:sleep(2),
    Ref = erlang:trace_delivered(all),
    receive {trace_delivered, all, Ref} -> ok end,
    {message_queue_len, N} = process_info(self(), message_queue_len),
    Look = {N, look(ets:lookup(otpst, {pid, root()}))},
    case Look of
        Prev -> settle(Prev, Same + 1);
        _ -> settle(Look, 0)
    end.

root() -> [{_, Root}] = ets:lookup(otpst, root), Root.

look([{_, Pid}]) -> look_sup(Pid);
look([]) -> none.

look_sup(Pid) ->
    case catch supervisor:which_children(Pid) of
        Children when is_list(Children) ->
            [{Id, C, case {Type, is_pid(C)} of
                         {supervisor, true} -> look_sup(C);
                         _ -> leaf
                     end} || {Id, C, Type, _} <- Children];
        _ -> dead
    end.

%% ---- records ----------------------------------------------------------------------------------

stamp() -> {erlang:monotonic_time(nanosecond), erlang:unique_integer([monotonic])}.

record(Term, Pid) ->
    [{ctl, Ctl}] = ets:lookup(otpst, ctl),
    Ctl ! {record, stamp(), Term, Pid}.

collect() -> collect([], #{}).
collect(Acc, Pids) ->
    receive
        {record, Stamp, Term, Pid} -> collect([{Stamp, Term} | Acc], Pids#{Pid => path_of(Term)});
        {trace_ts, Pid, exit, Reason, Stamp} -> collect([{Stamp, {exit, Pid, Reason}} | Acc], Pids);
        {trace_ts, _, _, _, _} -> collect(Acc, Pids);
        {trace_ts, _, _, _, _, _} -> collect(Acc, Pids);
        {'EXIT', _, _} -> collect(Acc, Pids)
    after 0 ->
        Sorted = [T || {_, T} <- lists:sort(Acc)],
        lists:filtermap(fun(T) -> visible(T, Pids) end, Sorted)
    end.

path_of({start, Path, ok}) -> Path;
path_of({sup_start, Path}) -> Path;
path_of(_) -> none.

visible({exit, _Pid, {shutdown, {failed_to_start_child, _, _}}}, _) -> false;
visible({exit, Pid, Reason}, Pids) ->
    case maps:get(Pid, Pids, none) of
        none -> false;
        Path -> {true, {exit, Path, Reason}}
    end;
visible(Term, _) -> {true, Term}.

%% ---- the tree: one module is both the supervisor and the gen_server callback ------------------

start_worker(Path) -> gen_server:start_link(?MODULE, {worker, Path}, []).
start_sup(Path, Tree) -> supervisor:start_link(?MODULE, {sup, Path, Tree}).

child_spec(Parent, {worker, Id, Restart, Shutdown, Significant}) ->
    Path = join(Parent, Id),
    #{id => Id, start => {?MODULE, start_worker, [Path]}, restart => Restart,
      shutdown => Shutdown, significant => Significant, type => worker};
child_spec(Parent, {sup, Id, _Flags, Restart, Significant, _Children} = Tree) ->
    Path = join(Parent, Id),
    #{id => Id, start => {?MODULE, start_sup, [Path, Tree]}, restart => Restart,
      shutdown => infinity, significant => Significant, type => supervisor}.

join(Parent, Id) -> list_to_atom(atom_to_list(Parent) ++ "/" ++ atom_to_list(Id)).

init({sup, Path, {sup, _Id, Flags, _Restart, _Significant, Children}}) ->
    ets:insert(otpst, {{pid, Path}, self()}),
    ets:insert(otpst, {{sup, Path}, self()}),
    case ets:member(otpst, root) of
        false -> ets:insert(otpst, {root, Path});
        true -> ok
    end,
    record({sup_start, Path}, self()),
    {ok, {Flags, [child_spec(Path, C) || C <- Children]}};
init({worker, Path}) ->
    process_flag(trap_exit, true),
    Outcome = case ets:lookup(otpst, {plan, Path}) of
                  [{_, [Next | Rest]}] -> ets:insert(otpst, {{plan, Path}, Rest}), Next;
                  _ -> ok
              end,
    record({start, Path, Outcome}, self()),
    case Outcome of
        ok -> ets:insert(otpst, {{pid, Path}, self()}), {ok, Path};
        ignore -> ignore;
        {error, Reason} -> {stop, Reason}
    end.

handle_call(_Msg, _From, State) -> {reply, ok, State}.
handle_cast({stop, Reason}, State) -> {stop, Reason, State}.
handle_info(_Msg, State) -> {noreply, State}.
terminate(_Reason, _State) -> ok.
code_change(_Old, State, _Extra) -> {ok, State}.

%% ---- JSON out ---------------------------------------------------------------------------------

json(A) when is_atom(A) -> json_string(atom_to_list(A));
json(B) when is_binary(B) -> json_string(unicode:characters_to_list(B));
json(I) when is_integer(I) -> integer_to_list(I);
json(F) when is_float(F) -> float_to_list(F, [short]);
json(P) when is_pid(P) -> json_string(pid_to_list(P));
json(T) when is_tuple(T) -> json(tuple_to_list(T));
json(L) when is_list(L) -> [$[, lists:join($,, [json(X) || X <- L]), $]];
json(Other) -> json_string(io_lib:format("~p", [Other])).

json_string(S) -> [$", [escape(C) || C <- lists:flatten(S)], $"].
escape($") -> "\\\"";
escape($\\) -> "\\\\";
escape(C) when C < 32 -> io_lib:format("\\u~4.16.0b", [C]);
escape(C) -> C.
